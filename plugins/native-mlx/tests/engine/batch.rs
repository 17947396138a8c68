//! Continuous batching: a request's tokens are the same alone or batched, cold or from the prefix cache.

use std::ops::ControlFlow;
use std::sync::{mpsc, Barrier};
use std::time::Duration;

use hangar_native_mlx::{
    mlx_turn, BatchOptions, Batcher, Completion, Error, FinishReason, GenerateRequest, LoadOptions,
    Prompt, SamplingParams, Session, MERGE_PADDING_GPU,
};

use crate::fixtures::{fixtures, PROMPT};
use crate::greedy::{assert_same_greedy, check_same_tokens, on_gpu};

/// `n` pseudo-random ids of the tiny vocabulary (512), different per `seed`.
fn prompt(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 500) as u32 + 3
        })
        .collect()
}

fn request(ids: &[u32], max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(ids.to_vec()), max_tokens);
    r.ignore_eos = true;
    r
}

/// The prompt of a request of [`request`].
fn ids_of(r: &GenerateRequest) -> &[u32] {
    match &r.prompt {
        Prompt::Tokens(ids) => ids,
        other => panic!("a prompt of tokens, not {other:?}"),
    }
}

fn batcher(model: &str, prefix_cache_bytes: usize) -> Batcher {
    batcher_with(
        model,
        BatchOptions {
            prefix_cache_bytes,
            ..BatchOptions::default()
        },
    )
}

fn batcher_with(model: &str, options: BatchOptions) -> Batcher {
    Batcher::start(Session::load(&fixtures().model(model)).unwrap(), options)
}

fn run(b: &Batcher, r: &GenerateRequest) -> Completion {
    try_run(b, r).unwrap()
}

/// Runs `r`, checking that the streamed pieces add up to the answer.
pub fn try_run(b: &Batcher, r: &GenerateRequest) -> Result<Completion, Error> {
    let mut streamed = String::new();
    let done = b.generate(r.clone(), |e| {
        streamed.push_str(e.text);
        ControlFlow::Continue(())
    })?;
    assert_eq!(streamed, done.text);
    Ok(done)
}

/// Runs every request at once, from one thread each.
fn run_together(b: &Batcher, requests: &[GenerateRequest]) -> Vec<Completion> {
    try_run_together(b, requests)
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// [`try_run`] of every request at once, from one thread each.
pub fn try_run_together(
    b: &Batcher,
    requests: &[GenerateRequest],
) -> Vec<Result<Completion, Error>> {
    let start = Barrier::new(requests.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = requests
            .iter()
            .map(|r| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    try_run(b, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Prompts shorter and longer than a prefill chunk (128), so that batched
/// steps mix decoding tokens with prompt chunks of other requests, and
/// chunks of several prompts at the same offset attend as one batch (the
/// first blocks of 200, 300, 129 and 280 tokens; the second of 300 and 280).
fn mixed_requests() -> Vec<GenerateRequest> {
    [
        (1, 12),
        (2, 40),
        (3, 200),
        (4, 5),
        (5, 300),
        (6, 129),
        (7, 280),
    ]
    .iter()
    .map(|&(seed, n)| request(&prompt(seed, n), 20))
    .collect()
}

fn same_tokens_alone_and_batched(model: &str) {
    same_tokens_alone_and_batched_with(model, BatchOptions::default());
}

/// As [`same_tokens_alone_and_batched`], under `options` (the prefix cache
/// off): with decoding rows of different padded lengths attending in one
/// group (`merge_padding` unbounded: masked positions add exact zeros, so
/// on the CPU the tokens stay the same as alone), with the paged attention
/// kernel (a GPU's; the CPU keeps the groups), or with first prompt
/// chunks' tokens attending as decoding rows (on the CPU through the
/// groups, each token reading its positions under its mask).
fn same_tokens_alone_and_batched_with(model: &str, options: BatchOptions) {
    let requests = mixed_requests();
    let b = batcher_with(
        model,
        BatchOptions {
            prefix_cache_bytes: 0,
            ..options.clone()
        },
    );
    let alone: Vec<Vec<u32>> = requests.iter().map(|r| run(&b, r).token_ids).collect();
    assert_eq!(b.peak_batch(), 1);
    let together: Vec<Vec<u32>> = run_together(&b, &requests)
        .into_iter()
        .map(|c| c.token_ids)
        .collect();
    assert!(b.peak_batch() >= 4, "only {} ran together", b.peak_batch());
    // A timed step's decoding rows each gave a token (the first step of a
    // burst, read with nothing before it, is not timed).
    let stats = b.step_stats();
    let generated: u64 = alone.iter().chain(&together).map(|t| t.len() as u64).sum();
    assert!(
        stats.decode_rows + stats.mixed_rows <= generated,
        "{stats:?}"
    );
    assert!(
        stats.decode_steps > 0 && stats.decode_rows >= stats.decode_steps,
        "{stats:?}"
    );
    assert!(stats.decode_time > std::time::Duration::ZERO, "{stats:?}");
    // The prompts' padded lengths (128, 256 and 384) attend in groups of
    // their own, or all in one when merged: asked for, or by default on a
    // GPU (`MERGE_PADDING_GPU` spans them). First chunks' tokens as rows
    // (by default on a GPU where the paged kernel serves every layer) read
    // their own padded lengths, up to those three a chunk, in groups after
    // the decoding rows'.
    let merge_padding =
        options
            .merge_padding
            .unwrap_or(if on_gpu() { MERGE_PADDING_GPU } else { 0 });
    if merge_padding >= MERGE_PADDING_GPU {
        assert!(
            stats.decode_groups >= stats.pool_decode_steps
                && stats.decode_groups - stats.pool_decode_steps <= 3 * stats.chunks_as_rows,
            "{stats:?}"
        );
    } else {
        assert!(stats.decode_groups > stats.pool_decode_steps, "{stats:?}");
    }
    // Every prompt's first chunk (7 requests, twice), as rows or as a
    // chunk; sliding windows keep the chunks.
    let windows = model.starts_with("gemma3");
    match options.first_chunks_as_rows {
        Some(true) if !windows => assert_eq!(stats.chunks_as_rows, 14, "{stats:?}"),
        Some(_) => assert_eq!(stats.chunks_as_rows, 0, "{stats:?}"),
        None => {}
    }
    assert!(
        stats.prompt_chunks + stats.chunks_as_rows >= 14,
        "{stats:?}"
    );
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), 20);
        let what = format!("{model}: request {i} batched");
        assert_same_greedy(model, ids_of(&requests[i]), t, a, &what);
    }
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_float32() {
    same_tokens_alone_and_batched("llama");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_in_merged_groups() {
    let merged = BatchOptions {
        merge_padding: Some(usize::MAX),
        paged_attention: Some(false),
        ..BatchOptions::default()
    };
    same_tokens_alone_and_batched_with("llama", merged.clone());
    same_tokens_alone_and_batched_with("llama-bf16", merged.clone());
    // Sliding-window layers read each row's window, padded to the group's.
    same_tokens_alone_and_batched_with("gemma3_text", merged);
}

#[test]
fn greedy_tokens_are_the_same_alone_and_with_paged_attention() {
    // Grouped queries (2 heads over 1), per-head norms (qwen3),
    // 4-bit weights; on the CPU the kernel is not taken.
    for model in ["llama", "llama-bf16", "qwen3-q4"] {
        let paged = BatchOptions {
            paged_attention: Some(true),
            ..BatchOptions::default()
        };
        same_tokens_alone_and_batched_with(model, paged);
    }
}

#[test]
fn greedy_tokens_are_the_same_alone_and_with_first_chunks_as_rows() {
    // Prompt tokens beside decoding rows, 4-bit experts; sliding windows
    // keep their chunks.
    for model in ["llama", "qwen3_moe-q4", "gemma3_text"] {
        let rows = BatchOptions {
            first_chunks_as_rows: Some(true),
            ..BatchOptions::default()
        };
        same_tokens_alone_and_batched_with(model, rows);
    }
    // And a request alone gets the ids its prompt gets as chunks.
    let options = |as_rows| BatchOptions {
        first_chunks_as_rows: Some(as_rows),
        prefix_cache_bytes: 0,
        ..BatchOptions::default()
    };
    let (rows, chunks) = (
        batcher_with("llama", options(true)),
        batcher_with("llama", options(false)),
    );
    for r in mixed_requests() {
        let (a, b) = (run(&rows, &r).token_ids, run(&chunks, &r).token_ids);
        assert_same_greedy("llama", ids_of(&r), &a, &b, "as rows");
    }
    assert_eq!(rows.step_stats().chunks_as_rows, 7);
    assert_eq!(chunks.step_stats().chunks_as_rows, 0);
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_4bit_qwen3() {
    same_tokens_alone_and_batched("qwen3-q4");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_bfloat16() {
    same_tokens_alone_and_batched("llama-bf16");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_gemma3() {
    // Sliding windows of 8 positions: prompts of many chunks, chunks of
    // several prompts at once, decoding rows reading their windows.
    same_tokens_alone_and_batched("gemma3_text");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_4bit_phi3_and_gemma3() {
    same_tokens_alone_and_batched("phi3-q4");
    same_tokens_alone_and_batched("gemma3-q8");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_qwen3_moe() {
    same_tokens_alone_and_batched("qwen3_moe");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_4bit_qwen3_moe() {
    same_tokens_alone_and_batched("qwen3_moe-q4");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_gpt_oss() {
    same_tokens_alone_and_batched("gpt_oss");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_4bit_gpt_oss() {
    same_tokens_alone_and_batched("gpt_oss-q4");
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_mxfp4_gpt_oss() {
    same_tokens_alone_and_batched("gpt_oss-mxfp4");
}

/// 64 streams at once on routed experts (issue 35's "MoE under load"): a
/// decoding step of 64 rows sends at least 64 (row, expert) pairs through
/// the experts, where mlx-lm's order (and native-mlx's) sorts them by expert
/// before `gather_mm`, a path a lone sequence's decoding never takes; each
/// request's ids are still those it gets alone.
#[test]
fn sixty_four_streams_on_routed_experts_each_get_their_ids_alone() {
    for model in ["qwen3_moe", "gpt_oss-q4"] {
        let requests: Vec<GenerateRequest> = (0..64u64)
            .map(|i| request(&prompt(300 + i, 6 + (i as usize % 7) * 5), 12))
            .collect();
        let b = batcher(model, 0);
        let alone: Vec<Vec<u32>> = requests.iter().map(|r| run(&b, r).token_ids).collect();
        let together = run_together(&b, &requests);
        assert!(
            b.peak_batch() >= 48,
            "{model}: only {} of 64 ran together",
            b.peak_batch()
        );
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            let what = format!("{model}: request {i} of 64 streams");
            assert_same_greedy(model, ids_of(&requests[i]), &t.token_ids, a, &what);
        }
    }
}

/// `LoadOptions::sums_by_rows` adds a product's bias and the residual
/// after it inside products of several rows and after one-row products:
/// the same sums, rounded otherwise. A session with it and the batcher with
/// it (steps of several rows: a prefill's chunks, two decoding rows) give
/// ids whose log-probabilities under the default session are within float32
/// rounding of the greedy choice's, and a one-row step of Qwen2 (biased
/// queries, keys and values) or gpt-oss has no AddMM left.
#[test]
fn sums_by_rows_round_differently_and_mean_the_same() {
    let fused = LoadOptions {
        fuse_projections: Some(true),
        sums_by_rows: Some(false),
        ..LoadOptions::default()
    };
    let summed = LoadOptions {
        sums_by_rows: Some(true),
        ..fused.clone()
    };
    // On a GPU float32 products may run as TF32 (see `greedy`).
    let tolerance = if on_gpu() { 1e-2 } else { 1e-4 };
    // Biased queries, keys and values (Qwen2), none (Llama), biases
    // everywhere and routed experts (gpt-oss), routed experts (Qwen3-MoE),
    // normed sublayer outputs (Gemma 3), fused weights (Phi-3).
    for model in [
        "qwen2",
        "llama",
        "gpt_oss",
        "qwen3_moe",
        "gemma3_text",
        "phi3",
    ] {
        let dir = fixtures().model(model);
        let mut plain = Session::load_with(&dir, &fused).unwrap();
        let session = Session::load_with(&dir, &summed).unwrap();
        let b = Batcher::start(session, BatchOptions::default());
        let requests = [request(&prompt(11, 40), 24), request(&prompt(12, 9), 24)];
        let answers = run_together(&b, &requests);
        drop(b);
        let mut alone = Session::load_with(&dir, &summed).unwrap();
        let lone = alone
            .generate(&requests[0], |_| ControlFlow::Continue(()))
            .unwrap();
        for (what, ids, r) in [
            ("batched", &answers[0].token_ids, &requests[0]),
            ("batched", &answers[1].token_ids, &requests[1]),
            ("alone", &lone.token_ids, &requests[0]),
        ] {
            let scores = plain.score(ids_of(r), ids).unwrap();
            let worst = scores.iter().map(|s| s.gap()).fold(0.0, f32::max);
            assert!(
                worst <= tolerance,
                "{model} {what}: an id {worst} nats below the default's greedy choice"
            );
        }
        let ops = |s: &mut Session| s.decode_step_primitives(&PROMPT).unwrap();
        let (before, after) = (ops(&mut plain), ops(&mut alone));
        let addmm = |c: &std::collections::BTreeMap<String, usize>| c.get("AddMM").copied();
        if model == "qwen2" || model == "gpt_oss" {
            assert!(addmm(&before).is_some(), "{before:?}");
        }
        assert_eq!(addmm(&after), None, "{model}: {after:?}");
    }
}

#[test]
fn a_short_prompt_gives_the_session_tokens() {
    // A prompt within one chunk is prefilled in one pass by both paths;
    // decoding then reads the pool, padded and masked, past a bucket's end
    // (100 + 60 positions), where the session reads its own cache.
    for model in [
        "llama",
        "qwen3-q4",
        "llama-bf16",
        "phi3",
        "gemma3_text",
        "gemma3_text-bf16",
        "qwen3_moe",
        "gpt_oss",
    ] {
        let p = prompt(9, 100);
        let r = request(&p, 60);
        let mut session = Session::load(&fixtures().model(model)).unwrap();
        let expected = session.generate(&r, |_| ControlFlow::Continue(())).unwrap();
        let got = run(&batcher(model, 0), &r).token_ids;
        assert_same_greedy(model, &p, &got, &expected.token_ids, model);
    }
}

#[test]
fn seeded_sampling_is_the_same_alone_and_batched() {
    // Every other request stays greedy: a step that mixes greedy and
    // sampled rows builds its tokens row by row.
    let mut requests = mixed_requests();
    for (i, r) in requests.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1) {
        r.sampling = SamplingParams {
            temperature: 0.9,
            top_k: 50,
            seed: Some(100 + i as u64),
            ..SamplingParams::greedy()
        };
    }
    let b = batcher("llama", 0);
    let alone: Vec<Vec<u32>> = requests.iter().map(|r| run(&b, r).token_ids).collect();
    let together: Vec<Vec<u32>> = run_together(&b, &requests)
        .into_iter()
        .map(|c| c.token_ids)
        .collect();
    for (i, (r, (a, t))) in requests.iter().zip(alone.iter().zip(&together)).enumerate() {
        let what = format!("llama: request {i} batched");
        check_same_tokens("llama", ids_of(r), t, a, &r.sampling, &what)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_cold() {
    cached_prefix_gives_the_same_tokens_as_cold("llama", true);
}

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_cold_gemma3() {
    // Sliding windows that reach back into restored blocks.
    cached_prefix_gives_the_same_tokens_as_cold("gemma3_text", true);
}

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_cold_qwen3_moe() {
    cached_prefix_gives_the_same_tokens_as_cold("qwen3_moe", true);
}

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_cold_gpt_oss() {
    // The fixture's first block reaches the answer only through its one
    // full-attention layer, averaged over 290 positions (its sliding layer
    // sees 8): another first block gives the same 16 ids, in mlx-lm too.
    cached_prefix_gives_the_same_tokens_as_cold("gpt_oss", false);
    // A prompt that ends 3 tokens after the cached block: the sliding
    // layer's windows read the block's last positions from the cache.
    let b = batcher("gpt_oss", 64 << 20);
    let cold = batcher("gpt_oss", 0);
    let block = prompt(24, 128);
    run(&b, &request(&[block.clone(), prompt(25, 20)].concat(), 4));
    let short = [block.clone(), prompt(26, 3)].concat();
    let warm = run(&b, &request(&short, 16));
    assert_eq!(warm.usage.cached_prompt_tokens, 128);
    assert_eq!(warm.token_ids, run(&cold, &request(&short, 16)).token_ids);
    // Teeth: the block's last positions change the answer.
    let mut changed = short.clone();
    changed[121..128].copy_from_slice(&prompt(27, 7));
    assert_ne!(run(&cold, &request(&changed, 16)).token_ids, warm.token_ids);
}

#[test]
fn a_first_block_computed_as_rows_is_cached_as_a_chunk_is() {
    let options = |as_rows, bytes| BatchOptions {
        first_chunks_as_rows: Some(as_rows),
        prefix_cache_bytes: bytes,
        ..BatchOptions::default()
    };
    let b = batcher_with("llama", options(true, 64 << 20));
    let cold = batcher_with("llama", options(false, 0));
    let first = prompt(21, 300);
    let a = run(&b, &request(&first, 16));
    assert_eq!(b.step_stats().chunks_as_rows, 1);
    // Its first block came from rows, its second from a chunk.
    // Rows, a cached block and chunks compute different shapes: the same
    // ids on the CPU, within the near-tie rule on a GPU.
    let again = run(&b, &request(&first, 16));
    assert_eq!(again.usage.cached_prompt_tokens, 256);
    assert_same_greedy(
        "llama",
        &first,
        &again.token_ids,
        &a.token_ids,
        "from the cache",
    );
    let chunked = run(&cold, &request(&first, 16)).token_ids;
    assert_same_greedy("llama", &first, &chunked, &a.token_ids, "as a chunk");
    assert_eq!(cold.step_stats().chunks_as_rows, 0);
}

/// `first_block_matters`: the model's answer to the test's prompt changes
/// with its first block, which shows that the cached block is used.
fn cached_prefix_gives_the_same_tokens_as_cold(model: &str, first_block_matters: bool) {
    let b = batcher(model, 64 << 20);
    let cold = batcher(model, 0);
    let first = prompt(21, 300);
    let a = run(&b, &request(&first, 16));
    assert_eq!(a.usage.cached_prompt_tokens, 0);

    // The same prompt again: both whole blocks of its first 299 tokens.
    let again = run(&b, &request(&first, 16));
    assert_eq!(again.usage.cached_prompt_tokens, 256);
    assert_eq!(again.token_ids, a.token_ids);

    // A prompt sharing 200 tokens: the first block only.
    let mut other = first[..200].to_vec();
    other.extend(prompt(22, 90));
    let warm = run(&b, &request(&other, 16));
    assert_eq!(warm.usage.cached_prompt_tokens, 128);
    assert_eq!(warm.token_ids, run(&cold, &request(&other, 16)).token_ids);
    // The check has teeth: a different first block changes the answer.
    if first_block_matters {
        let mut changed = other.clone();
        changed[..128].copy_from_slice(&prompt(23, 128));
        assert_ne!(run(&cold, &request(&changed, 16)).token_ids, warm.token_ids);
    }

    // Batched with others, from the cache: still the same.
    let mut requests = mixed_requests();
    requests.push(request(&other, 16));
    let together = run_together(&b, &requests);
    let last = together.last().unwrap();
    assert_eq!(last.usage.cached_prompt_tokens, 256);
    assert_eq!(last.token_ids, warm.token_ids);
}

#[test]
fn a_request_decoding_alone_keeps_its_tokens_as_company_comes_and_goes() {
    // A sequence alone decodes on a cache of its own; a second request
    // moves it to the pool, and it is alone again once that one is done.
    // Its tokens are those of a run alone throughout, and the newcomer's
    // those of its own run alone.
    for model in ["llama", "llama-bf16", "gemma3_text", "gpt_oss"] {
        let b = batcher(model, 0);
        let long = request(&prompt(31, 150), 60);
        let short = request(&prompt(32, 40), 8);
        let (long_alone, short_alone) = (run(&b, &long).token_ids, run(&b, &short).token_ids);
        let (company, signal) = std::sync::mpsc::channel();
        let (first, second) = std::thread::scope(|s| {
            let (b, long) = (&b, &long);
            let first = s.spawn(move || {
                let mut n = 0;
                b.generate(long.clone(), |_| {
                    n += 1;
                    if n == 10 {
                        let _ = company.send(());
                    }
                    ControlFlow::Continue(())
                })
                .unwrap()
            });
            signal.recv().unwrap();
            let second = run(b, &short);
            (first.join().unwrap(), second)
        });
        assert_eq!(
            b.peak_batch(),
            2,
            "{model}: the second request joined the first"
        );
        assert!(
            first.token_ids.len() == 60 && second.token_ids.len() == 8,
            "{model}"
        );
        assert_eq!(first.token_ids, long_alone, "{model}: the first request");
        assert_eq!(second.token_ids, short_alone, "{model}: the second request");
    }
}

#[test]
fn cancelling_one_request_leaves_the_others_running() {
    let b = batcher("llama", 0);
    let requests = mixed_requests();
    let start = Barrier::new(2);
    let (cancelled, other) = std::thread::scope(|s| {
        let start = &start;
        let b = &b;
        let r0 = &requests[2];
        let r1 = &requests[4];
        let c = s.spawn(move || {
            start.wait();
            let mut n = 0;
            b.generate(r0.clone(), |_| {
                n += 1;
                if n == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap()
        });
        let o = s.spawn(move || {
            start.wait();
            run(b, r1)
        });
        (c.join().unwrap(), o.join().unwrap())
    });
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    assert_eq!(cancelled.token_ids.len(), 3);
    assert_eq!(other.finish_reason, FinishReason::Length);
    assert_eq!(other.token_ids, run(&b, &requests[4]).token_ids);
}

#[test]
fn bad_requests_fail_alone() {
    let b = batcher("llama", 0);
    let err = b.generate(request(&[], 4), |_| ControlFlow::Continue(()));
    assert_eq!(
        err.unwrap_err().to_string(),
        "invalid request: the prompt has no tokens"
    );
    assert_eq!(run(&b, &request(&[1, 2, 3], 4)).token_ids.len(), 4);
}

#[test]
fn models_in_one_process_take_turns_and_keep_their_tokens() {
    let b = batcher("llama", 0);
    let mut session = Session::load(&fixtures().model("qwen3")).unwrap();
    let (r, s) = (request(&prompt(8, 30), 12), request(&prompt(9, 20), 12));
    let alone = (run(&b, &r).token_ids, session_ids(&mut session, &s));
    session.clear_cache();
    let turn = mlx_turn();
    let (tokens, events) = mpsc::channel();
    let together = std::thread::scope(|scope| {
        let batched = {
            let (b, r, tokens) = (&b, &r, tokens.clone());
            scope.spawn(move || {
                b.generate(r.clone(), |_| {
                    let _ = tokens.send("batcher");
                    ControlFlow::Continue(())
                })
                .unwrap()
                .token_ids
            })
        };
        let session = scope.spawn(|| {
            let request = s.clone();
            let done = session.generate(&request, |_| {
                let _ = tokens.send("session");
                ControlFlow::Continue(())
            });
            done.unwrap().token_ids
        });
        // Neither computes a token while another thread holds the turn.
        let early = events.recv_timeout(Duration::from_millis(300));
        assert!(early.is_err(), "a token while the turn was held: {early:?}");
        drop(turn);
        (batched.join().unwrap(), session.join().unwrap())
    });
    assert_eq!(together, alone);
}

fn session_ids(session: &mut Session, r: &GenerateRequest) -> Vec<u32> {
    let done = session.generate(r, |_| ControlFlow::Continue(()));
    done.unwrap().token_ids
}

fn with_disk(model: &str, dir: &std::path::Path) -> Batcher {
    let session = Session::load(&fixtures().model(model)).unwrap();
    Batcher::start(
        session,
        BatchOptions {
            prefix_cache_bytes: 64 << 20,
            prefix_cache_dir: Some(dir.to_owned()),
            ..BatchOptions::default()
        },
    )
}

/// The block files under `dir`, sorted.
fn block_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|model| std::fs::read_dir(model.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn the_disk_tier_survives_a_restart_and_never_serves_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let ids = prompt(31, 300);
    let cold = run(&batcher("llama", 0), &request(&ids, 16));

    // Dropping the engine waits for its writes.
    let first = with_disk("llama", dir.path());
    assert_eq!(run(&first, &request(&ids, 16)).token_ids, cold.token_ids);
    drop(first);
    let files = block_files(dir.path());
    assert_eq!(files.len(), 2, "{files:?}");

    let restarted = with_disk("llama", dir.path());
    let warm = run(&restarted, &request(&ids, 16));
    assert_eq!(warm.usage.cached_prompt_tokens, 256);
    assert_eq!(warm.token_ids, cold.token_ids);
    drop(restarted);

    // A damaged second block: the first is served, the second recomputed
    // (and written again).
    let second = files
        .iter()
        .find(|f| {
            // Block 1's header lists the prompt's tokens from 128 on.
            let text = std::fs::read(f).unwrap();
            let header = String::from_utf8_lossy(&text[16..2000.min(text.len())]).into_owned();
            header.contains(&format!("\"tokens\":[{},{},", ids[128], ids[129]))
        })
        .expect("the second block's file");
    let mut bytes = std::fs::read(second).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(second, &bytes).unwrap();
    let damaged = with_disk("llama", dir.path());
    let again = run(&damaged, &request(&ids, 16));
    assert_eq!(again.usage.cached_prompt_tokens, 128);
    assert_eq!(again.token_ids, cold.token_ids);
    drop(damaged);
    assert_ne!(
        std::fs::read(second).unwrap(),
        bytes,
        "the damaged file was replaced"
    );

    // Another model finds files under its own name only; a block file of
    // this model copied there is refused.
    let other_cold = run(&batcher("qwen2", 0), &request(&ids, 16));
    let other = with_disk("qwen2", dir.path());
    drop(other);
    let other_dir = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|d| !second.starts_with(d))
        .expect("a folder for the second model");
    for f in &files {
        std::fs::copy(f, other_dir.join(f.file_name().unwrap())).unwrap();
    }
    let other = with_disk("qwen2", dir.path());
    let foreign = run(&other, &request(&ids, 16));
    assert_eq!(foreign.usage.cached_prompt_tokens, 0);
    assert_eq!(foreign.token_ids, other_cold.token_ids);
}
