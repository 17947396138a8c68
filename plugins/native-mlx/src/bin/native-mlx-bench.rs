//! Measures prompt and decode speed of native-mlx on model folders (the Rust half of scripts/native-mlx-bench.sh).
//!
//! For each model: load, one warm-up request, then `--runs` timed requests
//! on an empty cache (no prefix reuse) with a fixed pseudo-random prompt,
//! ignoring end-of-sequence tokens. Speeds use mlx-lm's definitions
//! (`stream_generate`): prompt tokens/s = prompt tokens / time to first
//! token; decode tokens/s = generated tokens / time after the first token.
//! Peak RSS is the process's high-water mark, so give each model its own
//! process when comparing memory.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use hangar_native_mlx::{
    check_paged_attention, probe, BatchOptions, Batcher, ChatMessage, ChatOptions, DraftLoad,
    Drafter, GenerateRequest, LoadOptions, Prompt, Session, SpecPrefill, SpecUsage, Speculation,
    StepStats,
};

/// mimalloc replaces malloc for the whole process, MLX included (feature
/// `override`): with glibc's malloc, the graph-building thread and MLX's
/// stream threads contend for arena locks on every op, which costs a third
/// of the per-token time of small models. Build with
/// `--no-default-features` to measure with the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Benchmark native-mlx on MLX model folders")]
struct Args {
    /// Model folders (config.json, safetensors, tokenizer.json).
    #[arg(required_unless_present_any = ["qmv_check", "gather_check", "paged_check"])]
    models: Vec<PathBuf>,
    /// On a GPU, quantized products of a few rows run on Hangar's own
    /// CUDA kernel (`LoadOptions::custom_qmv`).
    #[arg(long)]
    qmv: bool,
    /// On a GPU, mixture-of-experts products over rows sorted by expert
    /// run on Hangar's own CUDA kernel (`LoadOptions::custom_gather_qmv`,
    /// the default; `--gather-qmv false`: MLX's `gather_qmm`).
    #[arg(long, default_value_t = LoadOptions::default().custom_gather_qmv, action = clap::ArgAction::Set)]
    gather_qmv: bool,
    /// Biases and residuals added after one-row products and inside
    /// products of more rows (`LoadOptions::sums_by_rows`: `true` or
    /// `false`; unset, on a GPU only).
    #[arg(long)]
    sums_by_rows: Option<bool>,
    /// Instead: Hangar's sorted gathered kernel against MLX's `gather_qmm`
    /// at Qwen3-30B-A3B's and gpt-oss-20b's expert shapes (4- and 8-bit,
    /// bfloat16; the rows of 1, 8, 64 and 512 tokens): microseconds per
    /// product and the largest difference (GPU only).
    #[arg(long)]
    gather_check: bool,
    /// Instead: Hangar's quantized matrix-vector kernel against MLX's
    /// `quantized_matmul` on random weights at Qwen2.5-0.5B and 7B's
    /// matrix shapes (4- and 8-bit, groups of 64, bfloat16, 1 and 4 rows):
    /// a table of microseconds per product, the weights' read rate, and
    /// the largest difference (GPU only).
    #[arg(long)]
    qmv_check: bool,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens to generate.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Timed runs per model (after one warm-up run).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print one JSON object per model instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead: print the primitives of one single-stream decoding step's
    /// graph (after a `--prompt-tokens` prompt), by name, and their total
    /// per layer: what the host builds and submits for every token.
    #[arg(long)]
    graph_ops: bool,
    /// Also print where each decoding step's time goes.
    #[arg(long)]
    breakdown: bool,
    /// Keep the query/key/value and gate/up projections separate (they are
    /// fused by default on a GPU; see `LoadOptions::fuse_projections`).
    #[arg(long)]
    unfused: bool,
    /// Instead: this many requests at once through the batching engine
    /// (each its own prompt); prints aggregate tokens/s per run.
    #[arg(long)]
    concurrent: Option<usize>,
    /// Instead: print the greedy token ids of one request on the bench
    /// prompt as JSON (`{"model": ..., "ids": [...]}`), to compare engines'
    /// outputs (scripts/gpu-bench.sh). Also the batching engine's ids of
    /// the same request alone (`batch_of_one`) and among `--company` - 1
    /// others (`batched`), which exactness requires to be the same.
    #[arg(long, conflicts_with = "concurrent")]
    ids: bool,
    /// With `--ids`: how many requests the batched run has in all.
    #[arg(long, default_value_t = 8, requires = "ids")]
    company: usize,
    /// With `--concurrent`: each run is two rounds, one with every request
    /// free and one with this many of them (every other one first) under
    /// a JSON-schema grammar (a list of records that does not end within
    /// `--gen-tokens`), then a table of both rounds' aggregate tokens/s,
    /// their ratio per run and the grammar's host time per masked token.
    #[arg(long, requires = "concurrent")]
    masked: Option<usize>,
    /// With `--concurrent`: the requests arrive one after another over
    /// this many milliseconds (evenly spaced, as clients of a server do)
    /// instead of at once; a run is timed from the first arrival.
    #[arg(long, default_value_t = 0, requires = "concurrent")]
    arrivals_ms: u64,
    /// Instead: the models are embedders; embeddings per second for
    /// requests of each of these batch sizes (inputs of `--embed-tokens`
    /// tokens), over `--runs` rounds after a warm-up: a table of the median
    /// and the min-max spread.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["concurrent", "ids"])]
    embed: Option<Vec<usize>>,
    /// With `--embed`: tokens per input ([CLS] and [SEP] included).
    #[arg(long, default_value_t = 64)]
    embed_tokens: usize,
    /// The batching engine's token budget per step (`BatchOptions::step_tokens`).
    #[arg(long, default_value_t = BatchOptions::default().step_tokens)]
    step_tokens: usize,
    /// The batching engine's `BatchOptions::merge_padding` (default: by
    /// device, 32768 on a GPU, 0 on the CPU).
    #[arg(long)]
    merge_padding: Option<usize>,
    /// Whether the batching engine's decoding rows attend with Hangar's
    /// paged attention kernel (`BatchOptions::paged_attention`: default on
    /// a GPU; the CPU has none).
    #[arg(long)]
    paged_attention: Option<bool>,
    /// Whether first prompt chunks' tokens attend as decoding rows
    /// (`BatchOptions::first_chunks_as_rows`: default where the paged
    /// attention kernel is on).
    #[arg(long)]
    chunks_as_rows: Option<bool>,
    /// Instead: the paged attention kernel against MLX's ops in float32 at
    /// Qwen2.5-0.5B's, 7B's and Qwen3-8B's head shapes, bfloat16 and
    /// float32, rows of 1 to 1000 positions: the largest difference
    /// (GPU only).
    #[arg(long, conflicts_with_all = ["concurrent", "ids", "embed"])]
    paged_check: bool,
    /// With `--concurrent`: request `i` of `n` has `i * N / n` tokens fewer
    /// than `--prompt-tokens`, so that its sequences cross the pool's
    /// 128-position buckets at different steps, as a server's prompts do
    /// (equal prompts decode in lockstep, one attention group a step).
    #[arg(long, default_value_t = 0, requires = "concurrent")]
    prompt_spread: usize,
    /// Instead: single-stream decode through the batching engine with each
    /// of these proposers, in interleaved rounds (A B A B): `off`,
    /// `lookup` (prompt lookup), `oracle` (the speculative path's own
    /// answer as a predicted output, fed back until it predicts itself:
    /// acceptance 1.0, the verification machinery's ceiling, even where
    /// near-ties make that answer differ from plain decoding's on a GPU),
    /// `draft` (the model of `--draft-model`, or the model's own first
    /// `--draft-layers`, greedily ahead), `mtp` (the model's own
    /// multi-token-prediction layer, applied recursively: a MiMo folder
    /// that keeps `model.mtp_layers`), `forced` (the plain answer with
    /// every proposal taken unverified: acceptance 1.0 by construction);
    /// a
    /// table of the median decode tokens/s, its spread, the median ratio
    /// to `off` per round, acceptance, tokens per pass, and whether the
    /// ids equal plain decoding's.
    /// With `--concurrent`: a round per proposer (`off`, `lookup`) in turn,
    /// every request asking for it, and a table of the aggregate tokens/s
    /// (the batcher speculates only for a sequence decoding alone, so this
    /// measures what asking costs under load).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["ids", "embed", "masked"])]
    speculate: Option<Vec<String>>,
    /// With `--speculate`: tokens proposed per pass (0: adapted to the
    /// acceptance rate).
    #[arg(long, default_value_t = 0)]
    draft_tokens: usize,
    /// With `--speculate draft`: the draft model's folder (the same
    /// tokenizer as the model's).
    #[arg(long, conflicts_with = "draft_layers")]
    draft_model: Option<PathBuf>,
    /// With `--speculate draft`: the model's own first N layers draft
    /// (self-speculation) instead.
    #[arg(long)]
    draft_layers: Option<usize>,
    /// Instead: SpecPrefill against whole prefill on the bench prompt
    /// (best a long `--chat` document ending in a question), scored by
    /// `--draft-model` or `--draft-layers`, for each of these shares kept
    /// (1 is whole prefill), in interleaved rounds with the prefix cache
    /// off: a table of the median time to first token, its spread, the
    /// median ratio to whole prefill per round, and how far the greedy
    /// answer agrees with whole prefill's (the same first token; the
    /// share of `--gen-tokens` before the first difference).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["concurrent", "ids", "embed", "speculate"])]
    spec_prefill: Option<Vec<f32>>,
    /// A chat prompt instead of the pseudo-random token prompt: this user
    /// message (a file's text with `@FILE`), rendered with the model's
    /// chat template; generation ends at end-of-sequence or `--gen-tokens`.
    #[arg(long)]
    chat: Option<String>,
}

/// The batching engine's options for `args`.
fn batch_options(args: &Args) -> BatchOptions {
    BatchOptions {
        step_tokens: args.step_tokens,
        merge_padding: args.merge_padding,
        paged_attention: args.paged_attention,
        first_chunks_as_rows: args.chunks_as_rows,
        ..BatchOptions::default()
    }
}

/// Averages over the timed runs.
struct Measurement {
    prompt_tps: f64,
    decode_tps: f64,
    ttft_ms: f64,
    load_s: f64,
    /// Per decoding step, in microseconds: graph building, submitting,
    /// waiting for MLX, detokenizing.
    step_us: [f64; 4],
}

/// The same prompt ids scripts/native-mlx-bench's mlx-lm half uses.
fn prompt(len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((i * 7919 + 13) % u64::from(vocab)) as u32)
        .collect()
}

/// The model at `dir`, loaded as the flags ask.
fn load(args: &Args, dir: &Path) -> Result<Session> {
    let options = LoadOptions {
        fuse_projections: args.unfused.then_some(false),
        custom_qmv: args.qmv,
        custom_gather_qmv: args.gather_qmv,
        sums_by_rows: args.sums_by_rows,
        ..LoadOptions::default()
    };
    Session::load_with(dir, &options).with_context(|| format!("loading {}", dir.display()))
}

/// The bench prompt as a greedy request: the pseudo-random token prompt,
/// ignoring end-of-sequence, or the `--chat` message.
fn request(args: &Args, session: &Session) -> GenerateRequest {
    if let Some(chat) = &args.chat {
        let text = match chat.strip_prefix('@') {
            Some(file) => {
                std::fs::read_to_string(file).unwrap_or_else(|e| panic!("--chat @{file}: {e}"))
            }
            None => chat.clone(),
        };
        let prompt = Prompt::Chat {
            messages: vec![ChatMessage::new("user", text)],
            options: ChatOptions {
                add_generation_prompt: true,
                ..ChatOptions::default()
            },
        };
        return GenerateRequest::new(prompt, args.gen_tokens);
    }
    let vocab = session.model().config().vocab_size as u32;
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::new(
            Prompt::Tokens(prompt(args.prompt_tokens, vocab)),
            args.gen_tokens,
        )
    }
}

/// The text of `request`'s answer.
fn batcher_text(batcher: &Batcher, request: &GenerateRequest) -> Result<String> {
    Ok(batcher
        .generate(request.clone(), |_| ControlFlow::Continue(()))?
        .text)
}

/// The drafter `--draft-model` or `--draft-layers` names for `session`.
fn drafter(args: &Args, session: &Session) -> Result<Option<Drafter>> {
    Ok(match (&args.draft_model, args.draft_layers) {
        (Some(draft), _) => match Drafter::load(draft, session)? {
            DraftLoad::Fits(drafter) => Some(*drafter),
            DraftLoad::Unfit(why) => {
                anyhow::bail!("--draft-model {}: does not fit: {why}", draft.display())
            }
        },
        (None, Some(layers)) => Some(Drafter::first_layers(session, layers)?),
        (None, None) => None,
    })
}

/// SpecPrefill against whole prefill; prints the table `--spec-prefill`
/// describes.
fn spec_prefill(args: &Args, dir: &Path, keeps: &[f32]) -> Result<()> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    // One engine per share, each scoring with its own drafter; every
    // engine is built before the first round, so rounds interleave.
    let mut engines = Vec::new();
    let mut prompt_tokens = 0;
    for &keep in keeps {
        let session = load(args, dir)?;
        let base = request(args, &session);
        prompt_tokens = session.prompt_tokens(&base.prompt)?.len();
        let Some(scorer) = drafter(args, &session)? else {
            anyhow::bail!("--spec-prefill needs --draft-model DIR or --draft-layers N");
        };
        let options = BatchOptions {
            prefix_cache_bytes: 0,
            spec_prefill: (keep < 1.0).then(|| SpecPrefill {
                min_tokens: 1,
                keep,
                ..SpecPrefill::default()
            }),
            ..batch_options(args)
        };
        engines.push((
            base,
            Batcher::start_with_drafter(session, options, Some(scorer)),
        ));
    }
    let run = |(base, batcher): &(GenerateRequest, Batcher)| -> Result<(f64, Vec<u32>, String)> {
        let started = Instant::now();
        let mut first = None;
        let done = batcher.generate(base.clone(), |_| {
            first.get_or_insert_with(Instant::now);
            ControlFlow::Continue(())
        })?;
        let ttft = first.unwrap_or(started).duration_since(started);
        Ok((ttft.as_secs_f64() * 1e3, done.token_ids, done.text))
    };
    // Warm-up, and the answers (greedy: each share's is the same every round).
    let answers: Vec<(Vec<u32>, String)> = engines
        .iter()
        .map(|e| run(e).map(|(_, ids, text)| (ids, text)))
        .collect::<Result<_>>()?;
    let whole = keeps.iter().position(|&k| k >= 1.0);
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); keeps.len()];
    for _ in 0..args.runs.max(1) {
        for (i, engine) in engines.iter().enumerate() {
            ttfts[i].push(run(engine)?.0);
        }
    }
    println!(
        "{} (prompt {prompt_tokens} tokens, {} generated, {} rounds)",
        dir.display(),
        args.gen_tokens,
        args.runs.max(1)
    );
    println!(
        "{:<6} {:>9} {:>17} {:>10} {:>12} {:>16}",
        "keep", "TTFT ms", "spread", "vs whole", "same first", "agree (prefix)"
    );
    for (i, keep) in keeps.iter().enumerate() {
        let (ttft, lo, hi) = median(ttfts[i].clone());
        let ratio =
            whole.map(|w| median(ttfts[i].iter().zip(&ttfts[w]).map(|(a, b)| a / b).collect()).0);
        let (ids, text) = &answers[i];
        let (same, agree) = match whole {
            Some(w) => {
                let reference = &answers[w].0;
                let prefix = ids
                    .iter()
                    .zip(reference)
                    .take_while(|(a, b)| a == b)
                    .count();
                let len = reference.len().max(1);
                (
                    if ids.first() == reference.first() {
                        "yes"
                    } else {
                        "no"
                    },
                    format!("{:.2}", prefix as f64 / len as f64),
                )
            }
            None => ("-", "-".to_string()),
        };
        println!(
            "{keep:<6} {ttft:>9.1} {:>17} {:>10} {same:>12} {agree:>16}",
            format!("{lo:.1}-{hi:.1}"),
            ratio.map_or("-".to_string(), |r| format!("{r:.2}x")),
        );
        if args.chat.is_some() {
            println!(
                "       answer: {:?}",
                text.chars().take(160).collect::<String>()
            );
        }
    }
    Ok(())
}

/// One speculation round's figures.
struct SpecRun {
    decode_tps: f64,
    usage: SpecUsage,
    ids: Vec<u32>,
    /// The batcher's step statistics over the run.
    steps: StepStats,
}

/// Single-stream decode with each proposer of `modes`, in interleaved
/// rounds; prints the table `--speculate` describes.
fn speculation(args: &Args, dir: &Path, modes: &[String]) -> Result<()> {
    let session = load(args, dir)?;
    let base = request(args, &session);
    let drafter = drafter(args, &session)?;
    if modes.iter().any(|m| m == "draft") && drafter.is_none() {
        anyhow::bail!("--speculate draft needs --draft-model DIR or --draft-layers N");
    }
    if modes.iter().any(|m| m == "mtp") {
        if let Some(why) = session.model().why_no_mtp() {
            anyhow::bail!("--speculate mtp: {why}");
        }
    }
    let batcher = Batcher::start_with_drafter(session, batch_options(args), drafter);
    let run = |spec: Speculation| -> Result<SpecRun> {
        let mut request = base.clone();
        request.speculation = spec;
        let stats = batcher.step_stats();
        let started = Instant::now();
        let mut first = None;
        let done = batcher.generate(request, |_| {
            first.get_or_insert_with(Instant::now);
            ControlFlow::Continue(())
        })?;
        let first = first.unwrap_or(started);
        let n = done.usage.completion_tokens.saturating_sub(1).max(1);
        Ok(SpecRun {
            decode_tps: n as f64 / first.elapsed().as_secs_f64(),
            usage: done.speculation,
            ids: done.token_ids,
            steps: delta(&stats, &batcher.step_stats()),
        })
    };
    // Warm-up, and the plain answer the oracle predicts.
    let plain = run(Speculation::default())?.ids;
    if args.chat.is_some() {
        let text = batcher_text(&batcher, &base)?;
        println!("answer: {text:?}");
    }
    // The oracle predicts the answer its own verifying passes give. On a
    // GPU a pass of k + 1 rows runs other kernels than a plain step, and
    // where the top logits nearly tie (random weights) its greedy token
    // can differ from plain decoding's, so the plain answer is rejected
    // there; the speculative path's own answer, fed back until it
    // predicts itself, is kept whole: acceptance 1.0, the ceiling.
    let mut oracle = plain.clone();
    if modes.iter().any(|m| m == "oracle") {
        for _ in 0..4 {
            let own = run(Speculation {
                prediction: Some(oracle.clone()),
                k: args.draft_tokens,
                ..Speculation::default()
            })?
            .ids;
            if own == oracle {
                break;
            }
            oracle = own;
        }
    }
    let spec_of = |mode: &str| -> Result<Speculation> {
        let k = args.draft_tokens;
        Ok(match mode {
            "off" => Speculation::default(),
            "lookup" => Speculation {
                prompt_lookup: true,
                k,
                ..Speculation::default()
            },
            "oracle" => Speculation {
                prediction: Some(oracle.clone()),
                k,
                ..Speculation::default()
            },
            "draft" => Speculation {
                draft_model: true,
                k,
                ..Speculation::default()
            },
            "mtp" => Speculation {
                mtp: true,
                k,
                ..Speculation::default()
            },
            // The plain answer, every proposal taken unverified: the
            // machinery's cost at acceptance 1.0 exactly (the ids then
            // are the proposals', and may differ on a GPU).
            "forced" => Speculation {
                prediction: Some(plain.clone()),
                k,
                accept_all: true,
                ..Speculation::default()
            },
            other => {
                anyhow::bail!(
                    "--speculate: unknown proposer '{other}' (off, lookup, oracle, draft, mtp, forced)"
                )
            }
        })
    };
    let specs = modes
        .iter()
        .map(|m| spec_of(m))
        .collect::<Result<Vec<_>>>()?;
    let mut rounds: Vec<Vec<SpecRun>> = (0..modes.len()).map(|_| Vec::new()).collect();
    for _ in 0..args.runs.max(1) {
        for (i, spec) in specs.iter().enumerate() {
            rounds[i].push(run(spec.clone())?);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let off = modes.iter().position(|m| m == "off");
    println!(
        "{} ({} tokens, k {}, {} rounds)",
        dir.display(),
        plain.len(),
        if args.draft_tokens == 0 {
            "auto".to_string()
        } else {
            args.draft_tokens.to_string()
        },
        args.runs.max(1)
    );
    println!(
        "{:<8} {:>12} {:>17} {:>9} {:>11} {:>10} {:>9}",
        "proposer", "decode tok/s", "spread", "vs off", "acceptance", "tok/pass", "same ids"
    );
    for (i, mode) in modes.iter().enumerate() {
        let runs = &rounds[i];
        let (tps, lo, hi) = median(runs.iter().map(|r| r.decode_tps).collect());
        let ratio = off.map(|o| {
            median(
                runs.iter()
                    .zip(&rounds[o])
                    .map(|(r, p)| r.decode_tps / p.decode_tps)
                    .collect(),
            )
            .0
        });
        let total = runs.iter().fold(SpecUsage::default(), |mut t, r| {
            t.verifications += r.usage.verifications;
            t.proposed += r.usage.proposed;
            t.accepted += r.usage.accepted;
            t
        });
        let acceptance = match total.proposed {
            0 => "-".to_string(),
            p => format!("{:.2}", total.accepted as f64 / p as f64),
        };
        let per_pass = match total.verifications {
            0 => "-".to_string(),
            v => format!("{:.2}", (total.accepted + v) as f64 / v as f64),
        };
        let same = runs.iter().all(|r| r.ids == plain);
        println!(
            "{mode:<8} {tps:>12.1} {:>17} {:>9} {acceptance:>11} {per_pass:>10} {:>9}",
            format!("{lo:.1}-{hi:.1}"),
            ratio.map_or("-".to_string(), |r| format!("{r:.2}x")),
            if same { "yes" } else { "NO" }
        );
    }
    // Where a step's time went, over all rounds of each proposer: a plain
    // step (pipelined: the next is built while MLX computes this one) and a
    // speculative pass (proposing, building the verifying graph, waiting
    // for MLX, the rest).
    println!(
        "{:<8} {:>14} {:>12} {:>11} {:>9} {:>9} {:>9}",
        "proposer", "plain step ms", "passes", "pass ms", "propose", "build", "wait"
    );
    for (i, mode) in modes.iter().enumerate() {
        let mut t = StepStats::default();
        for r in &rounds[i] {
            t.decode_steps += r.steps.decode_steps;
            t.decode_time += r.steps.decode_time;
            t.spec_steps += r.steps.spec_steps;
            t.spec_time += r.steps.spec_time;
            t.spec_propose_time += r.steps.spec_propose_time;
            t.spec_build_time += r.steps.spec_build_time;
            t.spec_wait_time += r.steps.spec_wait_time;
        }
        let per = |d: Duration, n: u64| d.as_secs_f64() * 1e3 / n.max(1) as f64;
        let passes = t.spec_steps;
        println!(
            "{mode:<8} {:>14.2} {passes:>12} {:>11.2} {:>9.2} {:>9.2} {:>9.2}",
            per(t.decode_time, t.decode_steps),
            per(t.spec_time, passes),
            per(t.spec_propose_time, passes),
            per(t.spec_build_time, passes),
            per(t.spec_wait_time, passes),
        );
    }
    Ok(())
}

/// The greedy ids of the bench request: from a session, then from the
/// batching engine alone and with `--company` - 1 other requests.
fn greedy_ids(args: &Args, dir: &Path) -> Result<serde_json::Value> {
    let mut session = load(args, dir)?;
    let request = request(args, &session);
    let vocab = session.model().config().vocab_size as u32;
    let alone = session
        .generate(&request, |_| ControlFlow::Continue(()))?
        .token_ids;
    drop(session);
    let batcher = Batcher::start(load(args, dir)?, batch_options(args));
    let batch_of_one = batcher
        .generate(request.clone(), |_| ControlFlow::Continue(()))?
        .token_ids;
    let others: Vec<GenerateRequest> = (1..args.company)
        .map(|i| {
            let mut other = request.clone();
            if let Prompt::Tokens(ids) = &mut other.prompt {
                ids[0] = (i as u32 * 31 + 7) % vocab;
            }
            other
        })
        .collect();
    let batched = std::thread::scope(|s| {
        let first = s.spawn(|| batcher.generate(request.clone(), |_| ControlFlow::Continue(())));
        for other in &others {
            s.spawn(|| batcher.generate(other.clone(), |_| ControlFlow::Continue(())));
        }
        first.join().expect("no panic")
    })?
    .token_ids;
    Ok(serde_json::json!({
        "model": dir, "ids": alone, "batch_of_one": batch_of_one, "batched": batched,
        "peak_batch": batcher.peak_batch(),
    }))
}

fn measure(args: &Args, dir: &Path) -> Result<Measurement> {
    let started = Instant::now();
    let mut session = load(args, dir)?;
    let load_s = started.elapsed().as_secs_f64();
    let request = request(args, &session);
    let (mut prompt_tps, mut decode_tps, mut ttft) = (0.0, 0.0, 0.0);
    let mut step_us = [0.0; 4];
    for run in 0..=args.runs {
        session.clear_cache();
        let done = session.generate(&request, |_| ControlFlow::Continue(()))?;
        if run == 0 {
            continue; // warm-up
        }
        let first = done.timings.time_to_first_token.as_secs_f64();
        prompt_tps += done.usage.prompt_tokens as f64 / first;
        decode_tps += done.usage.completion_tokens as f64 / done.timings.decode.as_secs_f64();
        ttft += first * 1e3;
        let t = &done.timings;
        let steps = done.usage.completion_tokens.saturating_sub(1).max(1) as f64;
        for (sum, part) in
            step_us
                .iter_mut()
                .zip([t.graph_build, t.submit, t.eval_wait, t.detokenize])
        {
            *sum += part.as_secs_f64() * 1e6 / steps;
        }
    }
    let n = args.runs.max(1) as f64;
    Ok(Measurement {
        prompt_tps: prompt_tps / n,
        decode_tps: decode_tps / n,
        ttft_ms: ttft / n,
        load_s,
        step_us: step_us.map(|v| v / n),
    })
}

/// `n` requests at once through a [`Batcher`]: aggregate decode tokens/s
/// (all generated tokens over the wall time) per run.
fn batched(args: &Args, dir: &Path, n: usize) -> Result<()> {
    let session = load(args, dir)?;
    let vocab = session.model().config().vocab_size as u32;
    let batcher = Batcher::start(session, batch_options(args));
    let requests: Vec<GenerateRequest> = (0..n)
        .map(|i| {
            let mut ids = prompt(args.prompt_tokens, vocab);
            ids.truncate(
                args.prompt_tokens
                    .saturating_sub(i * args.prompt_spread / n)
                    .max(1),
            );
            // Distinct prompts: nothing is shared through the prefix cache.
            ids[0] = (i as u32 * 31 + 7) % vocab;
            GenerateRequest {
                ignore_eos: true,
                ..GenerateRequest::new(Prompt::Tokens(ids), args.gen_tokens)
            }
        })
        .collect();
    // Free rounds, or free and masked rounds in turn (A B A B).
    let masked = args.masked.unwrap_or(0).min(n);
    let mut masked_requests = requests.clone();
    let order: Vec<usize> = (0..n).step_by(2).chain((1..n).step_by(2)).collect();
    for &i in order.iter().take(masked) {
        masked_requests[i].grammar = Some(RECORDS_GRAMMAR.to_string());
    }
    // With `--speculate`: a round per proposer, every request proposing.
    let speculating: Vec<(String, Vec<GenerateRequest>)> = match &args.speculate {
        Some(modes) => modes
            .iter()
            .map(|mode| {
                let speculation = load_speculation(mode, args.draft_tokens)?;
                let requests = requests
                    .iter()
                    .map(|r| GenerateRequest {
                        speculation: speculation.clone(),
                        ..r.clone()
                    })
                    .collect();
                Ok((format!(" {mode}"), requests))
            })
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let rounds: Vec<(&str, &Vec<GenerateRequest>)> = match args.masked {
        Some(_) => vec![(" free", &requests), (" masked", &masked_requests)],
        None if !speculating.is_empty() => speculating
            .iter()
            .map(|(label, requests)| (label.as_str(), requests))
            .collect(),
        None => vec![("", &requests)],
    };
    let mut table: Vec<(usize, &str, f64, StepStats)> = Vec::new();
    for run in 0..=args.runs {
        for &(label, requests) in &rounds {
            let before = batcher.step_stats();
            let start = Instant::now();
            let (tokens, mut ttfts): (Vec<usize>, Vec<Duration>) = std::thread::scope(|s| {
                let handles: Vec<_> = requests
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let batcher = &batcher;
                        let arrival = start
                            + Duration::from_millis(args.arrivals_ms) * i as u32
                                / (n.max(2) - 1) as u32;
                        s.spawn(move || {
                            std::thread::sleep(arrival.saturating_duration_since(Instant::now()));
                            let mut r = r.clone();
                            // A new first token per run: a cold prompt every time.
                            if let Prompt::Tokens(ids) = &mut r.prompt {
                                ids[1] = (run as u32 * 17 + 3) % vocab;
                            }
                            batcher
                                .generate(r, |_| ControlFlow::Continue(()))
                                .map(|c| (c.usage.completion_tokens, c.timings.time_to_first_token))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| match h.join().expect("no panic") {
                        Ok(done) => Some(done),
                        Err(e) => {
                            eprintln!("a request failed: {e}");
                            None
                        }
                    })
                    .unzip()
            });
            let wall = start.elapsed().as_secs_f64();
            let tokens: usize = tokens.iter().sum();
            println!(
            "{} x{n} run {run}{label}{}: {:.1} tok/s aggregate ({tokens} tokens in {wall:.2} s, \
             ttft p50 {:.1} ms p99 {:.1} ms, peak batch {})",
            dir.display(),
            if run == 0 { " (warm-up)" } else { "" },
            tokens as f64 / wall,
            percentile_ms(&mut ttfts, 50),
            percentile_ms(&mut ttfts, 99),
            batcher.peak_batch()
        );
            let after = batcher.step_stats();
            println!("    steps: {}", steps(&before, &after));
            if run > 0 {
                table.push((run, label, tokens as f64 / wall, delta(&before, &after)));
            }
        }
    }
    if args.masked.is_some() {
        print_masked_table(dir, n, masked, &table);
    }
    if !speculating.is_empty() {
        print_speculating_table(dir, n, &rounds, &table);
    }
    Ok(())
}

/// A proposer of `--concurrent` with `--speculate`: what every request of
/// its rounds asks for (no oracle: it needs each answer in advance).
fn load_speculation(mode: &str, k: usize) -> Result<Speculation> {
    Ok(match mode {
        "off" => Speculation::default(),
        "lookup" => Speculation {
            prompt_lookup: true,
            k,
            ..Speculation::default()
        },
        other => {
            anyhow::bail!("--speculate with --concurrent: unknown proposer '{other}' (off, lookup)")
        }
    })
}

/// `--concurrent` with `--speculate`'s table: per proposer the median
/// aggregate tokens/s, its spread and the median of its ratio to the
/// first proposer's (A B A B rounds, one pair per run).
fn print_speculating_table(
    dir: &Path,
    n: usize,
    rounds: &[(&str, &Vec<GenerateRequest>)],
    table: &[(usize, &str, f64, StepStats)],
) {
    let of =
        |label: &str| -> Vec<f64> { table.iter().filter(|r| r.1 == label).map(|r| r.2).collect() };
    let median = |mut v: Vec<f64>| -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => (f64::NAN, f64::NAN, f64::NAN),
            len => ((v[(len - 1) / 2] + v[len / 2]) / 2.0, v[0], v[len - 1]),
        }
    };
    let first = of(rounds[0].0);
    println!(
        "\n{}: {n} streams, every request speculating",
        dir.display()
    );
    println!(
        "| proposer | aggregate tok/s | spread | vs{} per run (median) |",
        rounds[0].0
    );
    println!("| --- | ---: | --- | ---: |");
    for &(label, _) in rounds {
        let values = of(label);
        let ratios = values.iter().zip(&first).map(|(a, b)| a / b).collect();
        let (tps, lo, hi) = median(values);
        let (ratio, rlo, rhi) = median(ratios);
        println!("|{label} | {tps:.1} | {lo:.1}-{hi:.1} | {ratio:.3} ({rlo:.3}-{rhi:.3}) |");
    }
}

/// What the masked rounds of `--masked` constrain: a list of records that
/// a random-weight model cannot finish within the bench's tokens, so every
/// masked request decodes as long as a free one.
const RECORDS_GRAMMAR: &str = r#"start: %json {"type": "array", "minItems": 100000, "items": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}}, "required": ["id", "name", "ok"], "additionalProperties": false}, "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}}"#;

/// The step statistics between `before` and `after`.
fn delta(before: &StepStats, after: &StepStats) -> StepStats {
    StepStats {
        masks: after.masks - before.masks,
        grammar_time: after.grammar_time - before.grammar_time,
        decode_steps: after.decode_steps - before.decode_steps,
        decode_time: after.decode_time - before.decode_time,
        spec_steps: after.spec_steps - before.spec_steps,
        spec_time: after.spec_time - before.spec_time,
        spec_propose_time: after.spec_propose_time - before.spec_propose_time,
        spec_build_time: after.spec_build_time - before.spec_build_time,
        spec_wait_time: after.spec_wait_time - before.spec_wait_time,
        ..StepStats::default()
    }
}

/// `--masked`'s table: per run the free and masked rounds' aggregate
/// tokens/s and their ratio, then medians with min-max.
fn print_masked_table(
    dir: &Path,
    n: usize,
    masked: usize,
    table: &[(usize, &str, f64, StepStats)],
) {
    let of = |label: &str| -> Vec<&(usize, &str, f64, StepStats)> {
        table.iter().filter(|r| r.1 == label).collect()
    };
    let (free, masked_rows) = (of(" free"), of(" masked"));
    println!(
        "\n{}: {n} streams, {masked} under a JSON-schema grammar",
        dir.display()
    );
    println!("| run | free tok/s | masked tok/s | masked / free | decode step ms (masked) | grammar us per masked token |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut ratios = Vec::new();
    let mut costs = Vec::new();
    for (f, m) in free.iter().zip(&masked_rows) {
        let ratio = m.2 / f.2;
        let stats = &m.3;
        let cost = stats.grammar_time.as_secs_f64() * 1e6 / stats.masks.max(1) as f64;
        let step = stats.decode_time.as_secs_f64() * 1e3 / stats.decode_steps.max(1) as f64;
        ratios.push(ratio);
        costs.push(cost);
        println!(
            "| {} | {:.1} | {:.1} | {ratio:.3} | {step:.2} | {cost:.0} |",
            f.0, f.2, m.2
        );
    }
    let median = |v: &mut Vec<f64>| -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => (f64::NAN, f64::NAN, f64::NAN),
            len => ((v[(len - 1) / 2] + v[len / 2]) / 2.0, v[0], v[len - 1]),
        }
    };
    let (r, rmin, rmax) = median(&mut ratios);
    let (c, cmin, cmax) = median(&mut costs);
    println!(
        "| median (min-max) | | | {r:.3} ({rmin:.3}-{rmax:.3}) | | {c:.0} ({cmin:.0}-{cmax:.0}) |"
    );
}

/// `--paged-check`: the paged attention kernel's largest difference from
/// MLX's ops in float32, per head shape and type.
fn paged_table() -> Result<()> {
    let lens = [1, 37, 128, 129, 300, 1000];
    println!("| heads / kv heads / head dim | dtype | rows' lengths | largest difference |");
    println!("|---|---|---|---:|");
    for (heads, kv_heads, d) in [(14, 2, 64), (28, 4, 128), (32, 8, 128)] {
        for dtype in [mlx_rs::Dtype::Bfloat16, mlx_rs::Dtype::Float32] {
            let error = check_paged_attention(heads, kv_heads, d, &lens, dtype)?;
            println!("| {heads} / {kv_heads} / {d} | {dtype:?} | {lens:?} | {error:.2e} |");
        }
    }
    Ok(())
}

/// Where the steps between `before` and `after` spent their time.
fn steps(before: &StepStats, after: &StepStats) -> String {
    let per = |time: Duration, n: u64| time.as_secs_f64() * 1e3 / n.max(1) as f64;
    let (decode, mixed) = (
        after.decode_steps - before.decode_steps,
        after.mixed_steps - before.mixed_steps,
    );
    format!(
        "{decode} decode-only at {:.2} ms ({:.1} rows) each, {mixed} with prompt chunks at \
         {:.2} ms ({:.1} rows, {:.0} prompt tokens) each; {:.2} attention groups a step; \
         {} prompt chunks in {} groups, {} as decoding rows",
        per(after.decode_time - before.decode_time, decode),
        (after.decode_rows - before.decode_rows) as f64 / decode.max(1) as f64,
        per(after.mixed_time - before.mixed_time, mixed),
        (after.mixed_rows - before.mixed_rows) as f64 / mixed.max(1) as f64,
        (after.mixed_prompt_tokens - before.mixed_prompt_tokens) as f64 / mixed.max(1) as f64,
        (after.decode_groups - before.decode_groups) as f64
            / (after.pool_decode_steps - before.pool_decode_steps).max(1) as f64,
        after.prompt_chunks - before.prompt_chunks,
        after.chunk_groups - before.chunk_groups,
        after.chunks_as_rows - before.chunks_as_rows,
    )
}

/// The nearest-rank `p`th percentile of `times`, in milliseconds (NaN
/// when there are none).
fn percentile_ms(times: &mut [Duration], p: usize) -> f64 {
    times.sort();
    let rank = (p * times.len()).div_ceil(100).max(1);
    times
        .get(rank - 1)
        .map_or(f64::NAN, |t| t.as_secs_f64() * 1e3)
}

/// The process's peak resident set (VmHWM), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Embeddings per second of the embedder at `dir`, for requests of each
/// of `sizes` inputs (the engine pads and batches them as it does for the
/// host: one forward for up to 16 384 tokens).
fn embeddings(args: &Args, dir: &Path, sizes: &[usize]) -> Result<()> {
    let kind = hangar_native_mlx::model_kind(dir)?;
    let start = Instant::now();
    let embedder = hangar_native_mlx::Embedder::load(dir, kind, &LoadOptions::default())
        .with_context(|| format!("loading {}", dir.display()))?;
    let load_s = start.elapsed().as_secs_f64();
    let vocab = embedder.tokenizer().vocab_size() as u32;
    println!(
        "{} ({:?}, pooling {}), {} tokens per input, {} rounds, load {load_s:.2} s",
        dir.display(),
        kind,
        embedder.pooling().id(),
        args.embed_tokens,
        args.runs
    );
    println!(
        "{:>8} {:>14} {:>22} {:>12}",
        "batch", "embeddings/s", "min-max", "ms/request"
    );
    for &n in sizes {
        // Distinct pseudo-random inputs, away from the special ids at the start.
        let inputs: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                (0..args.embed_tokens as u64)
                    .map(|i| {
                        (5 + (i * 7919 + r as u64 * 104_729 + 13) % u64::from(vocab - 5)) as u32
                    })
                    .collect()
            })
            .collect();
        if let hangar_native_mlx::Answer::Refused { message, .. } = embedder.embed(&inputs)? {
            anyhow::bail!("{}: {message}", dir.display());
        }
        let mut rates = Vec::with_capacity(args.runs);
        let mut ms = Vec::with_capacity(args.runs);
        for _ in 0..args.runs.max(1) {
            let t = Instant::now();
            embedder.embed(&inputs)?;
            let s = t.elapsed().as_secs_f64();
            rates.push(n as f64 / s);
            ms.push(s * 1e3);
        }
        rates.sort_by(f64::total_cmp);
        ms.sort_by(f64::total_cmp);
        println!(
            "{n:>8} {:>14.1} {:>22} {:>12.1}",
            rates[rates.len() / 2],
            format!("{:.1}-{:.1}", rates[0], rates[rates.len() - 1]),
            ms[ms.len() / 2]
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mlx = probe()?;
    if args.qmv_check {
        return qmv_table(&args);
    }
    if args.gather_check {
        return gather_table(&args);
    }
    if args.paged_check {
        return paged_table();
    }
    if let Some(sizes) = &args.embed {
        println!("native-mlx on MLX {} ({})", mlx.version, mlx.device);
        for dir in &args.models {
            embeddings(&args, dir, sizes)?;
        }
        return Ok(());
    }
    if !args.json && !args.ids && args.speculate.is_none() && args.spec_prefill.is_none() {
        println!(
            "native-mlx on MLX {} ({}), prompt {} tokens, {} generated, {} runs",
            mlx.version, mlx.device, args.prompt_tokens, args.gen_tokens, args.runs
        );
        println!(
            "{:<40} {:>12} {:>12} {:>10} {:>10} {:>8}",
            "model", "prompt tok/s", "decode tok/s", "TTFT ms", "peak RSS", "load s"
        );
    }
    for dir in &args.models {
        if args.ids {
            println!("{}", greedy_ids(&args, dir)?);
            continue;
        }
        if args.graph_ops {
            let mut session = load(&args, dir)?;
            let vocab = session.model().config().vocab_size as u32;
            let layers = session.model().config().num_layers;
            let counts = session.decode_step_primitives(&prompt(args.prompt_tokens, vocab))?;
            let total: usize = counts.values().sum();
            println!(
                "{}: {total} primitives in a decoding step, {:.1} per layer ({layers} layers)",
                dir.display(),
                total as f64 / layers as f64
            );
            for (name, n) in &counts {
                println!("    {name:<28} {n:>6}");
            }
            continue;
        }
        if let Some(n) = args.concurrent {
            batched(&args, dir, n)?;
            continue;
        }
        if let Some(modes) = &args.speculate {
            speculation(&args, dir, modes)?;
            continue;
        }
        if let Some(keeps) = &args.spec_prefill {
            spec_prefill(&args, dir, keeps)?;
            continue;
        }
        let m = measure(&args, dir)?;
        let rss = peak_rss_mib().unwrap_or(f64::NAN);
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "engine": if args.unfused { "native-mlx-unfused" } else { "native-mlx" }, "model": dir, "device": mlx.device.to_string(),
                    "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                    "prompt_tps": m.prompt_tps, "decode_tps": m.decode_tps,
                    "ttft_ms": m.ttft_ms, "peak_rss_mib": rss, "load_s": m.load_s,
                    "step_us": {"graph_build": m.step_us[0], "submit": m.step_us[1], "eval_wait": m.step_us[2], "detokenize": m.step_us[3]},
                })
            );
        } else {
            println!(
                "{:<40} {:>12.1} {:>12.1} {:>10.1} {:>7.0} MiB {:>8.2}",
                dir.display(),
                m.prompt_tps,
                m.decode_tps,
                m.ttft_ms,
                rss,
                m.load_s
            );
            if args.breakdown {
                let [build, submit, wait, detok] = m.step_us;
                println!(
                    "    per step: graph build {build:.0} us, submit {submit:.0} us, \
                     waiting for MLX {wait:.0} us, detokenize {detok:.0} us"
                );
            }
        }
    }
    Ok(())
}

/// `--qmv-check`'s table.
fn qmv_table(args: &Args) -> Result<()> {
    // (name, in, out): Qwen2.5-0.5B's and 7B's products (fused qkv and
    // gate-up, as a GPU runs them; the 7B head).
    const SHAPES: [(&str, i32, i32); 9] = [
        ("0.5B qkv", 896, 1152),
        ("0.5B o", 896, 896),
        ("0.5B gate-up", 896, 9728),
        ("0.5B down", 4864, 896),
        ("7B qkv", 3584, 4608),
        ("7B o", 3584, 3584),
        ("7B gate-up", 3584, 37888),
        ("7B down", 18944, 3584),
        ("7B head", 3584, 152064),
    ];
    println!(
        "| product | in | out | bits | rows | MLX us | hangar_qmv us | speed-up | MLX GB/s | hangar_qmv GB/s | max rel. difference |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for bits in [4, 8] {
        for (name, k, n) in SHAPES {
            for rows in [1, 4] {
                let shape = hangar_native_mlx::QmvShape {
                    k,
                    n,
                    rows,
                    bits,
                    group_size: 64,
                };
                let c = hangar_native_mlx::check_qmv(
                    shape,
                    mlx_rs::Dtype::Bfloat16,
                    50,
                    args.runs.max(1),
                )?;
                let rate = |us: f64| c.weight_bytes as f64 / us / 1e3;
                println!(
                    "| {name} | {k} | {n} | {bits} | {rows} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.0} | {:.1e} |",
                    c.mlx_us,
                    c.custom_us,
                    c.mlx_us / c.custom_us,
                    rate(c.mlx_us),
                    rate(c.custom_us),
                    c.max_error
                );
            }
        }
    }
    Ok(())
}

/// `--gather-check`'s table.
fn gather_table(args: &Args) -> Result<()> {
    // (name, experts, experts a token, in, out).
    const SHAPES: [(&str, i32, i32, i32, i32); 4] = [
        ("30B-A3B gate/up", 128, 8, 2048, 768),
        ("30B-A3B down", 128, 8, 768, 2048),
        ("gpt-oss-20b gate/up", 32, 4, 2880, 2880),
        ("gpt-oss-20b down", 32, 4, 2880, 2880),
    ];
    println!(
        "| product | experts | in | out | bits | tokens | rows | MLX us | hangar us | speed-up | hangar GB/s | max rel. difference |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for bits in [4, 8] {
        for (name, experts, per_token, k, n) in SHAPES {
            for tokens in [1, 8, 64, 512] {
                let shape = hangar_native_mlx::GatherShape {
                    experts,
                    k,
                    n,
                    rows: tokens * per_token,
                    bits,
                    group_size: 64,
                };
                let c = hangar_native_mlx::check_gather_qmv(
                    shape,
                    mlx_rs::Dtype::Bfloat16,
                    20,
                    args.runs.max(1),
                )?;
                println!(
                    "| {name} | {experts} | {k} | {n} | {bits} | {tokens} | {} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.1e} |",
                    shape.rows,
                    c.mlx_us,
                    c.custom_us,
                    c.mlx_us / c.custom_us,
                    c.weight_bytes as f64 / c.custom_us / 1e3,
                    c.max_error
                );
            }
        }
    }
    Ok(())
}
