//! `hangar bench`: a fair comparison of engines on the same model, through
//! the path users use. A `hangar serve` child loads one engine at a time
//! (chosen for the run through the host's `default_engines` setting) and
//! is asked through its API; after a warm-up, rounds run interleaved
//! (A B A B …), each loading the engine afresh: load time, time to first
//! token of a never-seen prompt (cold) and of the same prompt again
//! (warm), decode tokens/s, aggregate tokens/s at each concurrency, the
//! peak resident and GPU memory of the engine's processes (for an engine
//! inside the host, the host's), and, where the engine speculated, the
//! share of proposed tokens it kept and the tokens per verifying pass.
//! Every measure is a median with its min–max; the record keeps the
//! provenance (versions, platform, settings, model files, prompts, times).

mod compare;
mod files;
mod host;
mod machine;
mod report;
mod stats;
mod svg;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::output::outln;
use hangar_engine::models::{self, Model};
use hangar_engine::registry::resolve::Verdict;
use hangar_engine::registry::Registry;
use host::Host;
use report::{
    EngineResult, ModelInfo, PromptInfo, Protocol, Report, Speculation, SpeculationCounts,
};
use stats::Summary;

/// Options of `hangar bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The models: a model folder or file, or the id of a model in the
    /// model dirs.
    #[arg(required = true, value_name = "MODEL")]
    pub models: Vec<String>,
    /// Folders whose subfolders are models; repeatable. Added to the
    /// config's `model_dirs`.
    #[arg(long = "model-dir", env = "HANGAR_MODEL_DIR", value_delimiter = ':')]
    pub model_dirs: Vec<PathBuf>,
    /// The engines (plugin ids, comma-separated), or `all`: every engine
    /// that can serve the model.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Prompt sizes in words (about a token each), comma-separated.
    #[arg(long, default_value = "128", value_delimiter = ',', value_parser = positive("--prompt-tokens", 1_000_000))]
    pub prompt_tokens: Vec<u32>,
    /// Tokens to generate per answer (at least 2: decode speed is measured
    /// after the first).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    pub gen_tokens: u32,
    /// Concurrent streams, comma-separated: aggregate tokens/s at each
    /// (each stream a fresh prompt of the first --prompt-tokens size).
    #[arg(long, default_value = "1,4", value_delimiter = ',', value_parser = positive("--concurrency", 256))]
    pub concurrency: Vec<u32>,
    /// Measured rounds per engine.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// Skip the warm-up load and request (allowed for one engine only).
    #[arg(long)]
    pub no_warmup: bool,
    /// The prompts' seed (default: from the clock; recorded either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Measure engines that read different model files (the same weights
    /// as an MLX folder and as GGUF).
    #[arg(long)]
    pub allow_different_files: bool,
    /// Write the record as JSON (what --compare reads).
    #[arg(long, value_name = "FILE", value_parser = writable)]
    pub json_file: Option<PathBuf>,
    /// Write the results as Markdown.
    #[arg(long, value_name = "FILE", value_parser = writable)]
    pub markdown: Option<PathBuf>,
    /// Draw tokens/s and time to first token per engine as SVG.
    #[arg(long, value_name = "FILE", value_parser = writable)]
    pub svg: Option<PathBuf>,
    /// Compare with an earlier run's JSON record.
    #[arg(long, value_name = "EARLIER.json", value_parser = readable)]
    pub compare: Option<PathBuf>,
}

/// A value parser for a positive number of at most `max`, naming the flag.
fn positive(flag: &'static str, max: u32) -> impl Fn(&str) -> Result<u32, String> + Clone {
    move |s: &str| match s.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} takes whole numbers from 1 to {max}, comma-separated; got '{s}'"
        )),
    }
}

/// A value parser for an output file: its folder must exist, so that a run
/// of minutes does not end unable to write.
fn writable(s: &str) -> Result<PathBuf, String> {
    let file = PathBuf::from(s);
    let parent = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if parent.is_dir() {
        Ok(file)
    } else {
        Err(format!(
            "folder {} does not exist; create it first",
            parent.display()
        ))
    }
}

/// A value parser for an input file: it must be a readable file.
fn readable(s: &str) -> Result<PathBuf, String> {
    match std::fs::metadata(s) {
        Ok(m) if m.is_file() => Ok(PathBuf::from(s)),
        Ok(_) => Err(format!("{s} is not a file")),
        Err(e) => Err(format!("cannot read {s}: {e}")),
    }
}

/// What the command line gives `hangar bench` besides its own flags.
pub(crate) struct Invocation {
    /// The plugin dirs searched (the registry's).
    pub plugins_dirs: Vec<PathBuf>,
    /// The config file named on the command line.
    pub config: Option<PathBuf>,
    /// The settings file the user's host reads.
    pub settings: Option<PathBuf>,
    /// Print the record as JSON on stdout instead of the table.
    pub json: bool,
}

/// One engine on one model.
struct Contestant {
    engine: String,
    model: Model,
    format: String,
    info: ModelInfo,
    plugin_version: String,
    engine_version: Option<String>,
}

/// Runs `hangar bench`.
pub(crate) fn run(args: BenchArgs, registry: Registry, cx: Invocation) -> anyhow::Result<ExitCode> {
    let (contestants, model_dirs) = plan(&args, &registry)?;
    let pairs: Vec<(&str, &ModelInfo)> = contestants
        .iter()
        .map(|c| (c.engine.as_str(), &c.info))
        .collect();
    compare::check_same_files(&pairs, args.allow_different_files)?;
    compare::check_warmup(!args.no_warmup, contestants.len())?;
    for (flag, list) in [
        ("--prompt-tokens", &args.prompt_tokens),
        ("--concurrency", &args.concurrency),
    ] {
        let mut sorted = list.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != list.len() {
            bail!("{flag} lists a value twice ({list:?}); name each once");
        }
    }
    let earlier: Option<Report> = match &args.compare {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --compare file {}", path.display()))?;
            Some(serde_json::from_str(&text).with_context(|| {
                format!(
                    "--compare file {} is not a hangar bench record (write one with --json-file)",
                    path.display()
                )
            })?)
        }
        None => None,
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let protocol = Protocol {
        rounds: args.rounds,
        warmup: !args.no_warmup,
        prompt_tokens: args.prompt_tokens.clone(),
        gen_tokens: args.gen_tokens,
        concurrency: args.concurrency.clone(),
        temperature: 0.0,
        seed,
        order: "interleaved".into(),
        allow_different_files: args.allow_different_files,
    };
    if let (Some(earlier), Some(path)) = (&earlier, &args.compare) {
        compare::check_protocol(earlier, &path.display().to_string(), &protocol)?;
    }
    let platform = report::PlatformInfo {
        platform: registry.platform().to_string(),
        cpu_model: machine::cpu_model(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes: machine::memory_bytes(),
    };
    let started_at = machine::now_rfc3339();
    let load_start = machine::load_average();
    let runtime = tokio::runtime::Runtime::new()?;
    let (engines, prompts) =
        runtime.block_on(measure(&args, &cx, &contestants, &model_dirs, &protocol))?;
    let report = Report {
        schema: report::SCHEMA,
        hangar_version: env!("CARGO_PKG_VERSION").into(),
        started_at,
        ended_at: machine::now_rfc3339(),
        load_average: report::LoadAverage {
            start: load_start,
            end: machine::load_average(),
        },
        platform,
        protocol,
        prompts,
        engines,
    };
    let json_text = serde_json::to_string_pretty(&report).expect("reports serialize");
    if cx.json {
        outln!("{json_text}")?;
    } else {
        outln!("{}", report::text_table(&report))?;
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, format!("{json_text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, report::markdown(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::chart(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(earlier), Some(path)) = (&earlier, &args.compare) {
        let comparison = compare::compare(earlier, &path.display().to_string(), &report)?;
        if cx.json {
            eprintln!("{}", compare::render(&comparison));
        } else {
            outln!(
                "\ncompared with {}:\n{}",
                path.display(),
                compare::render(&comparison)
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine/model pairs to measure, and the model dirs the host needs.
fn plan(args: &BenchArgs, registry: &Registry) -> anyhow::Result<(Vec<Contestant>, Vec<PathBuf>)> {
    let mut model_dirs: Vec<PathBuf> = args.model_dirs.clone();
    model_dirs.extend(registry.config().model_dirs.iter().cloned());
    let mut found = Vec::new();
    // The host reads the config's model dirs itself: pass it only the
    // others, each once, absolute.
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let configured: Vec<PathBuf> = registry
        .config()
        .model_dirs
        .iter()
        .map(|d| absolute(d))
        .collect();
    let mut host_dirs: Vec<PathBuf> = Vec::new();
    for dir in &args.model_dirs {
        let dir = absolute(dir);
        if !configured.contains(&dir) && !host_dirs.contains(&dir) {
            host_dirs.push(dir);
        }
    }
    let discovery =
        (!model_dirs.is_empty()).then(|| models::discover(&model_dirs, registry.rules()));
    for arg in &args.models {
        let path = Path::new(arg);
        if path.exists() {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let model = models::recognize(&path, registry.rules())
                .map_err(|e| anyhow::anyhow!("{arg} is not a model: {e}"))?;
            let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
            if !configured.contains(&parent) && !host_dirs.contains(&parent) {
                host_dirs.push(parent);
            }
            found.push(model);
        } else if let Some(model) = discovery.as_ref().and_then(|d| d.find(arg)) {
            found.push(model.clone());
        } else {
            let ids: Vec<String> = discovery
                .as_ref()
                .map_or(vec![], |d| d.models.iter().map(|m| m.id.clone()).collect());
            bail!(
                "model '{arg}' is neither a path nor a model of the model dirs ({}); pass a model folder or file, or --model-dir",
                if ids.is_empty() { "none found".to_string() } else { format!("they hold: {}", ids.join(", ")) }
            );
        }
    }
    let all = args.engines.iter().any(|e| e == "all");
    if all && args.engines.len() > 1 {
        bail!(
            "--engines takes plugin ids or 'all', not both ({})",
            args.engines.join(",")
        );
    }
    for name in args.engines.iter().filter(|_| !all) {
        if registry.plugin(name).is_none() {
            let ids: Vec<&str> = registry
                .plugins()
                .iter()
                .map(|p| p.manifest.id.as_str())
                .collect();
            bail!(
                "--engines: no plugin '{name}' (the plugins are: {}); `hangar plugins` lists them",
                ids.join(", ")
            );
        }
    }
    let mut out = Vec::new();
    let mut why_not: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for model in &found {
        let format = registry.canonical_format(&model.format);
        let needs = model.needs();
        let resolution = registry.resolve_needing(&model.format, &needs, &BTreeMap::new());
        let info = ModelInfo {
            id: model.id.clone(),
            format: format.clone(),
            path: model.path.display().to_string(),
            files: files::fingerprint(&model.path, &model.files).map_err(anyhow::Error::msg)?,
        };
        for entry in &resolution.trace {
            let wanted = all || args.engines.iter().any(|e| e == entry.plugin);
            if !wanted {
                continue;
            }
            if let Verdict::Rejected(reason) = &entry.verdict {
                why_not
                    .entry(entry.plugin.to_string())
                    .or_default()
                    .push(format!("{}: {reason}", model.id));
                continue;
            }
            let plugin = registry.plugin(entry.plugin).expect("traced plugins exist");
            out.push(Contestant {
                engine: entry.plugin.to_string(),
                model: model.clone(),
                format: format.clone(),
                info: info.clone(),
                plugin_version: plugin.manifest.version.to_string(),
                engine_version: entry.engine_version.map(ToString::to_string),
            });
        }
    }
    if !all {
        for name in &args.engines {
            if !out.iter().any(|c| &c.engine == name) {
                let reasons = why_not.get(name).map_or_else(
                    || "it serves none of the models' formats".to_string(),
                    |r| r.join("; "),
                );
                bail!("--engines: '{name}' cannot serve any of the models: {reasons}");
            }
        }
    }
    if out.is_empty() {
        bail!(
            "no engine can serve {}; `hangar resolve MODEL` says why",
            found
                .iter()
                .map(|m| m.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((out, host_dirs))
}

/// Seeded prompts: words drawn from a fixed list (about one token each).
fn prompt(seed: u64, purpose: &str, words: u32) -> String {
    const WORDS: &[&str] = &[
        "the", "hangar", "engine", "model", "river", "quiet", "morning", "pilot", "light", "stone",
        "green", "table", "window", "number", "house", "water", "small", "large", "story", "paper",
        "garden", "music", "north", "winter", "summer", "road", "city", "market", "friend",
        "letter", "bridge", "cloud", "forest", "island", "mountain", "ocean", "silver", "travel",
        "yellow", "voice",
    ];
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(purpose.as_bytes());
    let digest = h.finalize();
    let mut state = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    let mut out = Vec::with_capacity(words as usize);
    for _ in 0..words {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.push(WORDS[(z % WORDS.len() as u64) as usize]);
    }
    out.join(" ")
}

/// Samples the memory of the host and of its process tree below it until
/// stopped: resident memory every 50 ms, GPU memory every 500 ms (where
/// `nvidia-smi` answers; it takes tens of milliseconds).
struct MemorySampler {
    stop: Arc<AtomicBool>,
    /// Peak resident bytes of the host, and of the processes below it.
    rss: Arc<[AtomicU64; 2]>,
    /// Peak GPU bytes of the host, and of the processes below it.
    gpu: Arc<[AtomicU64; 2]>,
    thread: std::thread::JoinHandle<()>,
}

/// What a [`MemorySampler`] saw: peaks of the engine's processes.
struct Peaks {
    rss: Option<u64>,
    gpu: Option<u64>,
}

impl MemorySampler {
    fn start(host: u32) -> MemorySampler {
        use crate::supervisor::rss;
        let stop = Arc::new(AtomicBool::new(false));
        let peaks = || Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (rss_peaks, gpu_peaks) = (peaks(), peaks());
        let thread = {
            let (stop, rss_peaks, gpu_peaks) = (stop.clone(), rss_peaks.clone(), gpu_peaks.clone());
            std::thread::spawn(move || {
                let mut gpu = true;
                for tick in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let (Some(own), Some(below)) = (rss::rss(host), rss::descendants(host)) {
                        let below_rss = below.iter().filter_map(|&pid| rss::rss(pid)).sum();
                        rss_peaks[0].fetch_max(own, Ordering::Relaxed);
                        rss_peaks[1].fetch_max(below_rss, Ordering::Relaxed);
                        if gpu && tick % 10 == 0 {
                            // No nvidia-smi: no GPU figure, and no more asking.
                            match rss::gpu_memory_by_pid() {
                                Some(by_pid) => {
                                    let of = |pid: &u32| by_pid.get(pid).copied().unwrap_or(0);
                                    gpu_peaks[0].fetch_max(of(&host), Ordering::Relaxed);
                                    gpu_peaks[1]
                                        .fetch_max(below.iter().map(of).sum(), Ordering::Relaxed);
                                }
                                None => gpu = false,
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        MemorySampler {
            stop,
            rss: rss_peaks,
            gpu: gpu_peaks,
            thread,
        }
    }

    /// The peaks of the host process (`in_host`: the engine runs inside
    /// it), or of the processes below it (the engine's, under its keeper);
    /// a figure that stayed zero is none.
    fn finish(self, in_host: bool) -> Peaks {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let peak = |p: &[AtomicU64; 2]| {
            Some(p[usize::from(!in_host)].load(Ordering::Relaxed)).filter(|p| *p > 0)
        };
        Peaks {
            rss: peak(&self.rss),
            gpu: peak(&self.gpu),
        }
    }
}

/// Samples gathered for one contestant.
#[derive(Default)]
struct Samples {
    load: Vec<f64>,
    ttft_cold: BTreeMap<u32, Vec<f64>>,
    ttft_warm: BTreeMap<u32, Vec<f64>>,
    decode: BTreeMap<u32, Vec<f64>>,
    prompt_counted: BTreeMap<u32, u64>,
    aggregate: BTreeMap<u32, Vec<f64>>,
    rss: Vec<f64>,
    gpu: Vec<f64>,
    /// Per round that speculated: the counts over its measured answers.
    speculation: Vec<SpeculationCounts>,
    short: u32,
    in_host: bool,
    settings: Value,
}

async fn measure(
    args: &BenchArgs,
    cx: &Invocation,
    contestants: &[Contestant],
    model_dirs: &[PathBuf],
    protocol: &Protocol,
) -> anyhow::Result<(Vec<EngineResult>, Vec<PromptInfo>)> {
    let work = tempfile::Builder::new().prefix("hangar-bench-").tempdir()?;
    // The user's settings, in a copy the run may change (the engine
    // chosen for each model) without touching theirs.
    let settings = work.path().join("settings.toml");
    if let Some(user) = cx.settings.as_ref().filter(|p| p.is_file()) {
        std::fs::copy(user, &settings)
            .with_context(|| format!("cannot copy settings {}", user.display()))?;
    }
    let mut argv: Vec<OsString> = vec![
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "0".into(),
    ];
    for d in model_dirs {
        argv.extend(["--model-dir".into(), d.clone().into_os_string()]);
    }
    for d in &cx.plugins_dirs {
        argv.extend(["--plugins-dir".into(), d.clone().into_os_string()]);
    }
    if let Some(c) = &cx.config {
        argv.extend(["--config".into(), c.clone().into_os_string()]);
    }
    argv.extend([
        "--state-dir".into(),
        work.path().join("state").into_os_string(),
    ]);
    let exe = std::env::current_exe().context("cannot find the hangar binary to run the host")?;
    let host = Host::start(
        &exe,
        argv,
        vec![("HANGAR_SETTINGS".into(), settings.into_os_string())],
        &["HANGAR_PLUGINS_DIR", "HANGAR_MODEL_DIR", "HANGAR_API_KEY"],
    )
    .await?;
    let result = rounds(args, &host, contestants, protocol).await;
    let result =
        result.map_err(|e| e.context(format!("the host's last lines:\n{}", host.log_tail())));
    host.stop().await;
    result
}

async fn rounds(
    args: &BenchArgs,
    host: &Host,
    contestants: &[Contestant],
    protocol: &Protocol,
) -> anyhow::Result<(Vec<EngineResult>, Vec<PromptInfo>)> {
    let host_pid = host.pid().context("the host exited")?;
    let steps = (contestants.len() as u64) * (u64::from(args.rounds) + u64::from(protocol.warmup));
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut prompts: BTreeMap<String, PromptInfo> = BTreeMap::new();
    let mut take_prompt = |purpose: String, words: u32| {
        let text = prompt(protocol.seed, &purpose, words);
        prompts
            .entry(purpose.clone())
            .or_insert_with(|| PromptInfo {
                purpose,
                words,
                sha256: format!("{:x}", Sha256::digest(text.as_bytes())),
                start: text.split(' ').take(8).collect::<Vec<_>>().join(" "),
            });
        text
    };
    let mut samples: Vec<Samples> = contestants.iter().map(|_| Samples::default()).collect();
    let gen = protocol.gen_tokens;
    let t = protocol.temperature;
    if protocol.warmup {
        for c in contestants {
            bar.set_message(format!("warm-up: {} on {}", c.engine, c.model.id));
            select(host, c).await?;
            load(host, c).await?;
            let text = take_prompt("warmup".into(), 16);
            host.complete(&c.model.id, &text, gen.min(8), t).await?;
            unload(host, c).await?;
            bar.inc(1);
        }
    }
    for round in 1..=protocol.rounds {
        for (c, s) in contestants.iter().zip(samples.iter_mut()) {
            let label = format!(
                "round {round}/{}: {} on {}",
                protocol.rounds, c.engine, c.model.id
            );
            bar.set_message(format!("{label}: loading"));
            s.settings = select(host, c).await?;
            let sampler = MemorySampler::start(host_pid);
            let started = Instant::now();
            let in_host = load(host, c).await?;
            s.load.push(started.elapsed().as_secs_f64());
            s.in_host = in_host;
            let mut speculated: Vec<SpeculationCounts> = Vec::new();
            for &p in &protocol.prompt_tokens {
                bar.set_message(format!("{label}: prompt of {p} words"));
                let text = take_prompt(format!("round-{round}-p{p}"), p);
                let cold = host.complete(&c.model.id, &text, gen, t).await?;
                let warm = host.complete(&c.model.id, &text, gen, t).await?;
                s.short += u32::from(cold.tokens < u64::from(gen))
                    + u32::from(warm.tokens < u64::from(gen));
                s.ttft_cold.entry(p).or_default().push(cold.ttft);
                s.ttft_warm.entry(p).or_default().push(warm.ttft);
                if let Some(tps) = warm.decode_tps() {
                    s.decode.entry(p).or_default().push(tps);
                }
                if let Some(n) = cold.prompt_tokens {
                    s.prompt_counted.insert(p, n);
                }
                speculated.extend(cold.speculation.into_iter().chain(warm.speculation));
            }
            let p0 = protocol.prompt_tokens[0];
            for &n in &protocol.concurrency {
                bar.set_message(format!("{label}: {n} concurrent stream(s)"));
                let texts: Vec<String> = (1..=n)
                    .map(|i| take_prompt(format!("round-{round}-x{n}-{i}"), p0))
                    .collect();
                let started = Instant::now();
                let all = futures_util::future::join_all(
                    texts
                        .iter()
                        .map(|text| host.complete(&c.model.id, text, gen, t)),
                )
                .await;
                let wall = started.elapsed().as_secs_f64();
                let mut tokens = 0;
                for r in all {
                    let r = r?;
                    s.short += u32::from(r.tokens < u64::from(gen));
                    tokens += r.tokens;
                    speculated.extend(r.speculation);
                }
                s.aggregate.entry(n).or_default().push(tokens as f64 / wall);
            }
            if !speculated.is_empty() {
                s.speculation.push(speculated.into_iter().sum());
            }
            unload(host, c).await?;
            let peaks = sampler.finish(in_host);
            s.rss.extend(peaks.rss.map(|b| b as f64));
            s.gpu.extend(peaks.gpu.map(|b| b as f64));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let summarize = |m: &BTreeMap<u32, Vec<f64>>| -> BTreeMap<u32, Summary> {
        m.iter()
            .filter_map(|(k, v)| Summary::of(v).map(|s| (*k, s)))
            .collect()
    };
    let results = contestants
        .iter()
        .zip(samples)
        .map(|(c, s)| EngineResult {
            engine: c.engine.clone(),
            plugin_version: c.plugin_version.clone(),
            engine_version: c.engine_version.clone(),
            model: c.info.clone(),
            settings: s.settings,
            load_s: Summary::of(&s.load),
            ttft_cold_s: summarize(&s.ttft_cold),
            ttft_warm_s: summarize(&s.ttft_warm),
            decode_tps: summarize(&s.decode),
            prompt_tokens_counted: s.prompt_counted,
            aggregate_tps: summarize(&s.aggregate),
            peak_rss_bytes: Summary::of(&s.rss),
            peak_gpu_bytes: Summary::of(&s.gpu),
            answers_short: s.short,
            rss_of: if s.in_host {
                "host process (the engine runs inside it)".into()
            } else {
                "engine process tree (under its keeper)".into()
            },
            speculation: Speculation::of(&s.speculation),
        })
        .collect();
    Ok((results, prompts.into_values().collect()))
}

/// The model's id in a URL path.
fn path_id(id: &str) -> String {
    id.replace('%', "%25").replace('/', "%2F")
}

/// Makes `c.engine` the engine of `c.format` for the run (the host's
/// `default_engines` setting) and returns the settings in effect.
async fn select(host: &Host, c: &Contestant) -> anyhow::Result<Value> {
    let mut app = host.call(Method::GET, "/api/settings", None).await?;
    app["default_engines"][&c.format] = json!(c.engine);
    host.call(Method::PUT, "/api/settings", Some(&app)).await?;
    host.call(
        Method::GET,
        &format!("/api/models/{}/settings", path_id(&c.model.id)),
        None,
    )
    .await
}

/// Loads `c` and checks that its engine serves it; returns whether the
/// engine runs inside the host.
async fn load(host: &Host, c: &Contestant) -> anyhow::Result<bool> {
    let answer = host
        .call(
            Method::POST,
            &format!("/api/models/{}/load", path_id(&c.model.id)),
            None,
        )
        .await
        .with_context(|| format!("{} could not load {}", c.engine, c.model.id))?;
    let serving = answer
        .pointer("/session/plugin")
        .and_then(Value::as_str)
        .unwrap_or("?");
    if serving != c.engine {
        let events = host
            .call(Method::GET, "/api/events", None)
            .await
            .unwrap_or(Value::Null);
        bail!(
            "{} did not load {}: the host fell back to {serving} (its events: {events}); \
             measure {serving} alone, or fix {} (see `hangar resolve`)",
            c.engine,
            c.model.id,
            c.engine
        );
    }
    Ok(answer.pointer("/session/endpoint").and_then(Value::as_str) == Some("in-process"))
}

async fn unload(host: &Host, c: &Contestant) -> anyhow::Result<()> {
    host.call(
        Method::POST,
        &format!("/api/models/{}/unload", path_id(&c.model.id)),
        None,
    )
    .await
    .map(drop)
}

/// Records for tests: a model, an engine's results, a run.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::files::FileFingerprint;
    use super::report::{LoadAverage, PlatformInfo};
    use super::*;

    pub(crate) fn model(id: &str, weights_hash: &str) -> ModelInfo {
        ModelInfo {
            id: id.into(),
            format: "mlx".into(),
            path: format!("/m/{id}"),
            files: vec![
                FileFingerprint {
                    name: "config.json".into(),
                    size: 10,
                    hashed: "file".into(),
                    sha256: Some("aaaaaaaaaaaaaaaa".into()),
                },
                FileFingerprint {
                    name: "model.safetensors".into(),
                    size: 99,
                    hashed: "header".into(),
                    sha256: Some(weights_hash.into()),
                },
            ],
        }
    }

    pub(crate) fn engine(id: &str, m: ModelInfo, decode: &[f64], ttft: &[f64]) -> EngineResult {
        EngineResult {
            engine: id.into(),
            plugin_version: "0.1.0".into(),
            engine_version: Some("1.0.0".into()),
            model: m,
            settings: serde_json::json!({}),
            load_s: Summary::of(&[1.0, 1.1]),
            ttft_cold_s: [(8, Summary::of(ttft).unwrap())].into(),
            ttft_warm_s: BTreeMap::new(),
            decode_tps: [(8, Summary::of(decode).unwrap())].into(),
            prompt_tokens_counted: BTreeMap::new(),
            aggregate_tps: BTreeMap::new(),
            peak_rss_bytes: None,
            peak_gpu_bytes: None,
            answers_short: 0,
            rss_of: "engine process tree".into(),
            speculation: None,
        }
    }

    /// `e` with speculation counts for each round, `(verifications,
    /// proposed, accepted)`.
    pub(crate) fn speculating(mut e: EngineResult, rounds: &[(u64, u64, u64)]) -> EngineResult {
        let rounds: Vec<SpeculationCounts> = rounds
            .iter()
            .map(
                |&(verifications, proposed_tokens, accepted_tokens)| SpeculationCounts {
                    verifications,
                    proposed_tokens,
                    accepted_tokens,
                    time_saved_ms: None,
                },
            )
            .collect();
        e.speculation = Speculation::of(&rounds);
        e
    }

    pub(crate) fn report(warmup: bool, gen: u32, engines: Vec<EngineResult>) -> Report {
        Report {
            schema: report::SCHEMA,
            hangar_version: "0.1.0".into(),
            started_at: "t0".into(),
            ended_at: "t1".into(),
            load_average: LoadAverage {
                start: None,
                end: None,
            },
            platform: PlatformInfo {
                platform: "linux/x86_64/cpu".into(),
                cpu_model: None,
                cpus: 2,
                memory_bytes: None,
            },
            protocol: Protocol {
                rounds: 2,
                warmup,
                prompt_tokens: vec![8],
                gen_tokens: gen,
                concurrency: vec![1],
                temperature: 0.0,
                seed: 1,
                order: "interleaved".into(),
                allow_different_files: false,
            },
            prompts: vec![],
            engines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_seeded() {
        let a = prompt(7, "round-1-p8", 8);
        assert_eq!(a, prompt(7, "round-1-p8", 8));
        assert_ne!(a, prompt(7, "round-2-p8", 8));
        assert_ne!(a, prompt(8, "round-1-p8", 8));
        assert_eq!(a.split(' ').count(), 8);
    }

    #[test]
    fn list_flags_name_the_flag() {
        let p = positive("--concurrency", 256);
        assert_eq!(p("4"), Ok(4));
        assert_eq!(
            p("0"),
            Err("--concurrency takes whole numbers from 1 to 256, comma-separated; got '0'".into())
        );
        assert_eq!(
            p("x"),
            Err("--concurrency takes whole numbers from 1 to 256, comma-separated; got 'x'".into())
        );
    }
}
