//! `mlx-lm`: the Hangar engine plugin for Python's `mlx_lm.server`.
//!
//! The host runs the manifest's probe (a Python snippet that imports
//! `mlx_lm` and `mlx.core`) with the interpreter the operator configured,
//! and this plugin reads its two lines:
//!
//! ```text
//! mlx_lm 0.32.2
//! device Device(cpu, 0)
//! ```
//!
//! For each model it then plans `python -m mlx_lm.server --model DIR --host
//! H --port P` plus the flags for the model's settings, each only where the
//! probed mlx-lm release has it (see the capability table in
//! `plugin.toml`). The plugin never runs anything itself.
//!
//! Three behaviours of `mlx_lm.server` shape the plan:
//! - `GET /health` answers 200 as soon as HTTP is up, while the model is
//!   still loading in a thread, so readiness adds a one-token completion;
//! - `/v1/models` sends an empty body unless the Hugging Face cache folder
//!   exists, so `HF_HUB_CACHE` points at the session's work dir;
//! - a request whose `model` is not the served path makes it fetch that
//!   name from the hub, so the upstream model is the path itself.
//!
//! A model whose settings name a cluster (`distributed = "tensor"` or
//! `"pipeline"`, `cluster = "NAME"`) is planned as `mlx.launch` with the
//! ring backend over the cluster's peers ([`distributed`]): the launcher
//! starts every rank (ssh for remote peers), rank 0 serves HTTP here, and
//! the plan lists the ranks so that the host supervises them as one.

use std::path::Path;
use std::sync::OnceLock;

use hangar_sdk::api::capability::{
    DISTRIBUTED_PIPELINE, DISTRIBUTED_TENSOR, KV_CACHE_QUANTIZATION, PROMPT_CACHE, SPECULATIVE,
    TOOL_CALLS,
};
use hangar_sdk::api::Manifest;
use hangar_sdk::wire::{
    settings, Cluster, Description, DistributedMode, LaunchPlan, LoadRequest, ProbeInput,
    ProbeReport, ProbeRun, Rank, Readiness, WarmupRequest,
};
use hangar_sdk::{export_plugin, Plugin};
use serde_json::Value;

/// This plugin's id, as in `plugin.toml`.
const ID: &str = "mlx-lm";

/// The format mlx_lm.server serves everywhere: a folder with `config.json`,
/// a tokenizer and `*.safetensors` shards.
const FORMAT: &str = "mlx";

/// A single-file GGUF model, which mlx (and so mlx_lm.server) reads on
/// macOS arm64 only: `plugin.toml` declares it for that platform alone, so
/// the host never resolves a GGUF model to this plugin elsewhere.
const GGUF: &str = "gguf";

/// Server-wide default sampling flags (`--temp`, `--top-p`, `--top-k`,
/// `--min-p`, `--max-tokens`); mlx-lm 0.23.0 and older have none of them.
pub const SAMPLING_DEFAULTS: &str = "sampling_defaults";

/// `--chat-template-args JSON`: keyword arguments for the chat template.
pub const CHAT_TEMPLATE_ARGS: &str = "chat_template_args";

/// The plugin's own setting (per model, or in `[plugins.mlx-lm]`) for how
/// long the server may take to load a model, in milliseconds.
pub const START_TIMEOUT_MS: &str = "start_timeout_ms";

/// Loading a large model from a slow disk takes a while; two minutes
/// covers a 7B model on an ordinary SSD.
const DEFAULT_START_TIMEOUT_MS: u64 = 120_000;

/// The first release with `GET /health` (0.23.0 lacks it, 0.25.0 has it;
/// see the table in `plugin.toml`). Older releases, and engines whose
/// version is unknown, are polled on `/v1/models`, which every release
/// serves; either way the warmup completion is what proves the model
/// loaded.
const HEALTH_ROUTE_SINCE: semver::Version = semver::Version::new(0, 25, 0);

/// The plugin. Every function is pure: it reads what the host sends and
/// answers with data.
pub struct MlxLm;

impl Plugin for MlxLm {
    fn describe() -> Description {
        hangar_sdk::describe!(ID, formats: [FORMAT, GGUF],
            aliases: {"safetensors" => FORMAT},
            capabilities: [SAMPLING_DEFAULTS, SPECULATIVE, CHAT_TEMPLATE_ARGS,
                PROMPT_CACHE, KV_CACHE_QUANTIZATION, DISTRIBUTED_TENSOR, DISTRIBUTED_PIPELINE,
                TOOL_CALLS])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(probe(&input))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        plan_launch(&request)
    }
}

export_plugin!(MlxLm);

/// Reads the probe snippet's output (see the module docs).
pub fn probe(input: &ProbeInput) -> ProbeReport {
    if let Some(ProbeRun::Exited {
        program,
        code,
        stderr,
        ..
    }) = &input.run
    {
        if *code != Some(0) {
            if let Some(error) = import_error(stderr) {
                return ProbeReport::unavailable(install_advice(program, error))
                    .with_program(program.clone());
            }
        }
    }
    let mut report = hangar_sdk::version_from_output(input, |out| field(out, "mlx_lm"));
    if let Some(ProbeRun::Exited { stdout, .. }) = &input.run {
        if report.available {
            report.device = field(stdout, "device").and_then(device_kind);
        }
    }
    report
}

/// The value of the first `KEY value` line of the probe's output.
fn field<'a>(output: &'a str, key: &str) -> Option<&'a str> {
    output.lines().find_map(|line| {
        let (k, value) = line.trim().split_once(' ')?;
        (k == key).then(|| value.trim())
    })
}

/// `Device(gpu, 0)` → `gpu`. MLX prints devices this way; the bare type
/// (`cpu`, `DeviceType.gpu`) is accepted too in case a release prints that.
fn device_kind(text: &str) -> Option<String> {
    let inner = text.strip_prefix("Device(").unwrap_or(text);
    let kind = inner.split([',', ')']).next()?.trim();
    let kind = kind.strip_prefix("DeviceType.").unwrap_or(kind);
    let valid = !kind.is_empty() && kind.chars().all(|c| c.is_ascii_alphanumeric());
    valid.then(|| kind.to_ascii_lowercase())
}

/// The import error a failed probe ended with, if that is why it failed.
fn import_error(stderr: &str) -> Option<&str> {
    let last = stderr.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let is_import = last.starts_with("ModuleNotFoundError")
        || last.starts_with("ImportError")
        || last.contains("No module named");
    is_import.then_some(last)
}

fn install_advice(program: &str, error: &str) -> String {
    format!(
        "{program} cannot import mlx_lm and mlx ({error}). Install them into that interpreter \
         (`{program} -m pip install \"mlx[cpu]\" mlx-lm` on Linux, `mlx[cuda13]` or `mlx[cuda12]` \
         for NVIDIA GPUs, plain `mlx-lm` on macOS), or point Hangar at a Python that has them: \
         `[plugins.{ID}] program = \"/path/to/venv/bin/python\"` in config.toml"
    )
}

/// One setting that becomes one command-line flag.
struct Flag {
    setting: &'static str,
    flag: &'static str,
    /// The capability the flag belongs to; the flag is passed only when
    /// the host turned it on for this engine version.
    capability: &'static str,
    /// Another setting without which this one does nothing.
    needs: Option<&'static str>,
    /// Checks the value and renders the flag's argument.
    value: fn(&Value) -> Result<String, String>,
}

/// Every flag, in the order it appears on the command line.
const FLAGS: &[Flag] = &[
    Flag {
        setting: settings::MAX_TOKENS,
        flag: "--max-tokens",
        capability: SAMPLING_DEFAULTS,
        needs: None,
        value: positive_integer,
    },
    Flag {
        setting: settings::TEMPERATURE,
        flag: "--temp",
        capability: SAMPLING_DEFAULTS,
        needs: None,
        value: temperature,
    },
    Flag {
        setting: settings::TOP_P,
        flag: "--top-p",
        capability: SAMPLING_DEFAULTS,
        needs: None,
        value: top_p,
    },
    Flag {
        setting: settings::TOP_K,
        flag: "--top-k",
        capability: SAMPLING_DEFAULTS,
        needs: None,
        value: non_negative_integer,
    },
    Flag {
        setting: settings::MIN_P,
        flag: "--min-p",
        capability: SAMPLING_DEFAULTS,
        needs: None,
        value: min_p,
    },
    Flag {
        setting: settings::DRAFT_MODEL,
        flag: "--draft-model",
        capability: SPECULATIVE,
        needs: None,
        value: local_folder,
    },
    Flag {
        setting: settings::DRAFT_TOKENS,
        flag: "--num-draft-tokens",
        capability: SPECULATIVE,
        needs: Some(settings::DRAFT_MODEL),
        value: positive_integer,
    },
    Flag {
        setting: settings::PROMPT_CACHE_SIZE,
        flag: "--prompt-cache-size",
        capability: PROMPT_CACHE,
        needs: None,
        value: positive_integer,
    },
    Flag {
        setting: settings::KV_BITS,
        flag: "--kv-bits",
        capability: KV_CACHE_QUANTIZATION,
        needs: None,
        value: kv_bits,
    },
    Flag {
        setting: settings::CHAT_TEMPLATE_ARGS,
        flag: "--chat-template-args",
        capability: CHAT_TEMPLATE_ARGS,
        needs: None,
        value: json_object,
    },
];

/// Plans `python -m mlx_lm.server` for one model.
pub fn plan_launch(request: &LoadRequest) -> Result<LaunchPlan, String> {
    let model = &request.model_id;
    let model_path = match request.format.as_str() {
        FORMAT => existing_folder(&request.model_path).map_err(|reason| {
            format!("model '{model}': the model path {reason}; mlx_lm.server serves an MLX model folder (config.json, tokenizer, *.safetensors)")
        })?,
        GGUF => gguf_file(&request.model_path).map_err(|reason| {
            format!("model '{model}': the model path {reason}; mlx_lm.server serves a GGUF model as one *.gguf file")
        })?,
        other => {
            return Err(format!(
                "model '{model}': plugin '{ID}' serves the '{FORMAT}' and '{GGUF}' formats, not '{other}'"
            ))
        }
    };

    // `-m mlx_lm.server` runs on every release; newer ones print a
    // deprecation line for it on stdout and behave the same.
    let mut args: Vec<String> = vec![
        "-m".into(),
        "mlx_lm.server".into(),
        "--model".into(),
        model_path.clone(),
        "--host".into(),
        request.host.clone(),
        "--port".into(),
        request.port.to_string(),
    ];
    let mut notes = Vec::new();
    let has = |capability: &str| request.capabilities.iter().any(|c| c == capability);

    if let Some(value) = setting(request, settings::CONTEXT_LENGTH) {
        notes.push(format!(
            "{} = {value} is not applied: mlx_lm.server has no context-length flag; the model's own limit holds",
            settings::CONTEXT_LENGTH
        ));
    }
    // Settings this table does not name (the host's own, such as TTLs)
    // are not the engine's business and are left alone.
    for flag in FLAGS {
        let Some(value) = setting(request, flag.setting) else {
            continue;
        };
        if !has(flag.capability) {
            notes.push(format!(
                "{} is not passed: {}",
                flag.setting,
                capability_off(flag.capability, flag.flag, request)
            ));
            continue;
        }
        if let Some(needed) = flag.needs.filter(|n| setting(request, n).is_none()) {
            notes.push(format!(
                "{} is not passed: it does nothing without {needed}",
                flag.setting
            ));
            continue;
        }
        let argument = (flag.value)(value).map_err(|reason| {
            format!(
                "model '{model}': setting {} = {value} is invalid: {reason}",
                flag.setting
            )
        })?;
        args.push(flag.flag.into());
        args.push(argument);
        if flag.setting == settings::KV_BITS {
            notes.push(
                "kv_bits: mlx_lm.server turns batching off while the KV cache is quantized, so it serves one request at a time".into(),
            );
        }
    }
    if let Some(note) = device_mismatch(request) {
        notes.push(note);
    }

    let start_timeout_ms = match setting(request, START_TIMEOUT_MS)
        .or_else(|| request.plugin_settings.get(START_TIMEOUT_MS))
    {
        None => DEFAULT_START_TIMEOUT_MS,
        Some(value) => value
            .as_u64()
            .filter(|&ms| ms > 0)
            .ok_or_else(|| {
                format!("model '{model}': setting {START_TIMEOUT_MS} = {value} is invalid: it must be a whole number of milliseconds above 0")
            })?,
    };

    let mut env: std::collections::BTreeMap<String, String> = [
        // mlx_lm.server's /v1/models scans the Hugging Face cache and sends
        // an empty body when the folder is missing; the host creates
        // work_dir, so point the cache there.
        ("HF_HUB_CACHE", request.work_dir.as_str()),
        // Never download: a misspelt model or draft path must fail, not
        // fetch something from the hub.
        ("HF_HUB_OFFLINE", "1"),
        // Logs reach the host as they happen, not when a buffer fills.
        ("PYTHONUNBUFFERED", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();

    let python = request
        .engine
        .program
        .clone()
        .unwrap_or_else(|| "python3".into());
    let (args, files, ranks) = match &request.cluster {
        None => (args, Default::default(), Vec::new()),
        Some(cluster) => distributed(request, cluster, &python, args, &mut env, &mut notes)?,
    };
    Ok(LaunchPlan::new(python, args)
        .with_env(env)
        // /health says ok while the model still loads in a thread; one
        // generated token proves it loaded. A load that fails leaves
        // /health at 503 for good.
        .with_readiness(
            Readiness::new(health_path(request))
                .with_warmup(WarmupRequest::new(
                    "/v1/completions",
                    serde_json::json!({"prompt": "hi", "max_tokens": 1}),
                ))
                .with_failed_statuses(vec![503]),
        )
        .with_start_timeout_ms(start_timeout_ms)
        .with_upstream_model(model_path)
        .with_notes(notes)
        .with_files(files)
        .with_ranks(ranks))
}

/// Runs `mlx.launch`'s `main` with the probed interpreter (what the
/// `mlx.launch` console script of that interpreter runs), so that the
/// launcher and every local rank use the same mlx.
const LAUNCHER: &str =
    "import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; sys.exit(main())";

/// The hostfile `mlx.launch --hostfile` reads, written into the session's
/// work dir by the host.
const HOSTFILE: &str = "hosts.json";

/// The safetensors shard index (`weight_map`: weight name → file).
const SHARD_INDEX: &str = "model.safetensors.index.json";

/// Environment the remote ranks need too (the local ones inherit the
/// launcher's): no hub downloads, unbuffered logs.
const RANK_ENV: [&str; 2] = ["HF_HUB_OFFLINE", "PYTHONUNBUFFERED"];

/// Turns the server's arguments into a launch over `cluster`: `python -c
/// LAUNCHER --backend ring --hostfile hosts.json --starting-port PORT
/// --python PYTHON -- -m mlx_lm.server …`. Rank `i` runs on peer `i`
/// (ssh for remote peers, directly for `127.0.0.1`), listens for the ring
/// on `port + i`, and is marked `MLX_RANK=i` (mlx.launch sets it). Rank 0
/// serves HTTP; the others follow its requests (mlx_lm.server's own
/// distributed mode: tensor parallel, or `--pipeline`).
type Distributed = (
    Vec<String>,
    std::collections::BTreeMap<String, String>,
    Vec<Rank>,
);

fn distributed(
    request: &LoadRequest,
    cluster: &Cluster,
    python: &str,
    server_args: Vec<String>,
    env: &mut std::collections::BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> Result<Distributed, String> {
    let model = &request.model_id;
    let mode = cluster.mode;
    if !request.capabilities.iter().any(|c| c == mode.capability()) {
        return Err(format!(
            "model '{model}': {}",
            capability_off(mode.capability(), "mlx.launch + mlx_lm.server", request)
        ));
    }
    if cluster.peers.len() < 2 {
        return Err(format!(
            "model '{model}': cluster '{}' has {} peer(s); a distributed launch needs two or more",
            cluster.name,
            cluster.peers.len()
        ));
    }
    if !cluster.peers[0].local {
        return Err(format!(
            "model '{model}': cluster '{}' starts with peer '{}', but rank 0 serves HTTP on this machine's loopback; put this machine (ssh = \"127.0.0.1\") first",
            cluster.name, cluster.peers[0].name
        ));
    }
    if setting(request, settings::DRAFT_MODEL).is_some() {
        return Err(format!(
            "model '{model}': draft_model cannot be used with distributed = \"{}\": mlx_lm.server loads no draft model in a distributed group; remove one of the two settings",
            mode.as_str()
        ));
    }
    // mlx-lm's pipeline loader reads the shard index to give each rank
    // only its layers' files; without it every rank dies at load.
    if mode == DistributedMode::Pipeline
        && !request.model_files.is_empty()
        && !request.model_files.iter().any(|f| f == SHARD_INDEX)
    {
        return Err(format!(
            "model '{model}': distributed = \"pipeline\" needs {SHARD_INDEX} in the model folder (mlx-lm's pipeline loader reads it to give each rank its layers); the folder has none: convert the model with mlx_lm.convert, which writes it, or use distributed = \"tensor\""
        ));
    }
    let hosts: Vec<Value> = cluster
        .peers
        .iter()
        .map(|p| serde_json::json!({"ssh": p.ssh, "ips": [p.ip]}))
        .collect();
    let hostfile = serde_json::json!({"backend": "ring", "envs": [], "hosts": hosts});
    let mut args: Vec<String> = vec![
        "-c".into(),
        LAUNCHER.into(),
        "--backend".into(),
        "ring".into(),
        "--hostfile".into(),
        Path::new(&request.work_dir)
            .join(HOSTFILE)
            .display()
            .to_string(),
        "--starting-port".into(),
        cluster.port.to_string(),
        "--python".into(),
        python.to_string(),
    ];
    for name in RANK_ENV {
        args.push("--env".into());
        args.push(format!("{name}={}", env[name]));
    }
    args.push("--".into());
    args.extend(server_args);
    if mode == DistributedMode::Pipeline {
        args.push("--pipeline".into());
    }
    // mlx.launch's own log lines (a rank that died, one it killed) come
    // through unbuffered with the ranks'.
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    let ranks: Vec<Rank> = cluster
        .peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Rank::new(i as u32, p.name.clone(), p.local).with_env_marker(format!("MLX_RANK={i}"))
        })
        .collect();
    let last = u32::from(cluster.port) + cluster.peers.len() as u32 - 1;
    notes.push(format!(
        "{} parallel over {} ranks of cluster '{}' (mlx.launch, ring backend, ports {}..={last}): {}",
        mode.as_str(),
        ranks.len(),
        cluster.name,
        cluster.port,
        cluster
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("rank {i} on {}", p.name))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let files = [(
        HOSTFILE.to_string(),
        serde_json::to_string_pretty(&hostfile).expect("json serializes"),
    )]
    .into_iter()
    .collect();
    Ok((args, files, ranks))
}

/// A setting's value; JSON `null` counts as unset, so a layer can clear a
/// value set below it.
fn setting<'a>(request: &'a LoadRequest, name: &str) -> Option<&'a Value> {
    request.settings.get(name).filter(|v| !v.is_null())
}

/// Why a capability is off, in the host's words: the capability, the
/// releases that have it, and the release found.
fn capability_off(capability: &str, flag: &str, request: &LoadRequest) -> String {
    let required = manifest()
        .and_then(|m| m.capabilities.get(capability))
        .map_or_else(|| "a newer release".into(), |req| req.to_string());
    let found = match &request.engine.version {
        Some(version) => format!("found {version}"),
        None => "the engine's version is unknown".into(),
    };
    format!("plugin '{ID}' needs mlx-lm {required} for {capability} ({flag}); {found}")
}

/// The manifest compiled into the plugin, the one source of the version
/// requirements that notes quote.
fn manifest() -> Option<&'static Manifest> {
    static MANIFEST: OnceLock<Option<Manifest>> = OnceLock::new();
    MANIFEST
        .get_or_init(|| Manifest::parse(include_str!("../plugin.toml")).ok())
        .as_ref()
}

fn health_path(request: &LoadRequest) -> &'static str {
    let version = request.engine.version.as_deref();
    match version.and_then(|v| semver::Version::parse(v).ok()) {
        Some(v) if v >= HEALTH_ROUTE_SINCE => "/health",
        _ => "/v1/models",
    }
}

/// The host picks the accelerator from the platform; the interpreter's mlx
/// build decides where the server really runs. Say so when they differ.
fn device_mismatch(request: &LoadRequest) -> Option<String> {
    let accelerator = request.accelerator.as_str();
    if request.engine.device.as_deref() != Some("cpu") || accelerator == "cpu" {
        return None;
    }
    let install = if accelerator.starts_with("cuda") {
        format!("install \"mlx[{accelerator}]\" into the interpreter to use the GPU")
    } else {
        "install a GPU build of mlx into the interpreter to use it".into()
    };
    Some(format!(
        "the host picked accelerator {accelerator}, but this interpreter's mlx runs on the cpu; {install}"
    ))
}

/// An existing folder, as an absolute path. A relative path is taken from
/// the host's working directory, as the operator wrote it; the server runs
/// in the session's work dir and would read it from there otherwise.
fn existing_folder(path: &str) -> Result<String, String> {
    let absolute = std::path::absolute(Path::new(path))
        .map_err(|e| format!("'{path}' cannot be made absolute: {e}"))?;
    if !absolute.is_dir() {
        return Err(format!(
            "'{}' is not an existing folder",
            absolute.display()
        ));
    }
    Ok(absolute.display().to_string())
}

/// The absolute path of a `*.gguf` file: `path` itself, or the only one in
/// the folder `path`.
fn gguf_file(path: &str) -> Result<String, String> {
    let absolute = std::path::absolute(Path::new(path))
        .map_err(|e| format!("'{path}' cannot be made absolute: {e}"))?;
    let is_gguf = |p: &Path| p.is_file() && p.extension().is_some_and(|e| e == GGUF);
    if is_gguf(&absolute) {
        return Ok(absolute.display().to_string());
    }
    let found: Vec<std::path::PathBuf> = std::fs::read_dir(&absolute)
        .map_err(|_| {
            format!(
                "'{}' is neither a *.gguf file nor a folder",
                absolute.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_gguf(p))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.display().to_string()),
        [] => Err(format!("'{}' holds no *.gguf file", absolute.display())),
        _ => Err(format!(
            "'{}' holds {} *.gguf files; point the model at one",
            absolute.display(),
            found.len()
        )),
    }
}

fn local_folder(value: &Value) -> Result<String, String> {
    let path = value
        .as_str()
        .ok_or("it must be the path of a local model folder (a string)")?;
    existing_folder(path).map_err(|reason| {
        format!("{reason}; the engine runs offline, so it must be a local MLX model folder, not a hub name")
    })
}

fn positive_integer(value: &Value) -> Result<String, String> {
    match value.as_u64() {
        Some(n) if n > 0 => Ok(n.to_string()),
        _ => Err("it must be a whole number above 0".into()),
    }
}

fn non_negative_integer(value: &Value) -> Result<String, String> {
    value
        .as_u64()
        .map(|n| n.to_string())
        .ok_or_else(|| "it must be a whole number, 0 or more (0 turns it off)".into())
}

/// A finite number within `range`; `what` names the range for the error.
fn number_in(value: &Value, range: impl Fn(f64) -> bool, what: &str) -> Result<String, String> {
    match value.as_f64() {
        Some(x) if x.is_finite() && range(x) => Ok(x.to_string()),
        _ => Err(format!("it must be a number {what}")),
    }
}

fn temperature(value: &Value) -> Result<String, String> {
    number_in(value, |x| x >= 0.0, "0 or more (0 samples greedily)")
}

fn top_p(value: &Value) -> Result<String, String> {
    number_in(value, |x| x > 0.0 && x <= 1.0, "above 0 and at most 1")
}

fn min_p(value: &Value) -> Result<String, String> {
    number_in(
        value,
        |x| (0.0..=1.0).contains(&x),
        "from 0 to 1 (0 turns it off)",
    )
}

fn kv_bits(value: &Value) -> Result<String, String> {
    match value.as_u64() {
        Some(bits @ (4 | 8)) => Ok(bits.to_string()),
        _ => Err("it must be 4 or 8".into()),
    }
}

fn json_object(value: &Value) -> Result<String, String> {
    if !value.is_object() {
        return Err("it must be a JSON object of chat-template keyword arguments, e.g. {\"enable_thinking\": false}".into());
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests;
