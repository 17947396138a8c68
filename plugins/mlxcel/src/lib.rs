//! `mlxcel`: the Hangar engine plugin for Lablup's `mlxcel-server`, the
//! preferred engine for MLX models.
//!
//! The host runs `mlxcel-server --version` (clap prints
//! `mlxcel-server 0.4.2`), then `mlxcel-server --dump-flag-surface` (or,
//! on builds without it, `--help`), and [`probe`] reads both: the version,
//! and the options the binary accepts ([`surface`]). Capabilities follow
//! the options where the manifest names them (`[flag_surface]`), the
//! version elsewhere. For each model [`plan_launch`] then plans
//!
//! ```text
//! mlxcel-server --model DIR --alias MODEL_ID --host 127.0.0.1 --port P [flags]
//! ```
//!
//! with one group of flags per setting, each only where the binary has
//! the capability behind it: an old binary never sees a flag it does not
//! know (clap would refuse it and the load would fail). The host
//! already refuses such settings with 422 from the manifest's
//! `[[settings]]`; the plan drops what still arrives (a value stored before
//! a downgrade) with a note. Speculative decoding ([`drafter`]) and
//! pipeline serving across machines ([`pipeline`]) have modules of their
//! own. The plugin never runs anything itself.
//!
//! Readiness is mlxcel's own: `GET /health` answers 503 while the model
//! loads (and when every slot is busy) and 200 once it serves, so no
//! warmup request is needed and no status means the load failed.

pub mod drafter;
pub mod pipeline;
pub mod surface;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hangar_sdk::api::Manifest;
use hangar_sdk::wire::{
    settings as names, Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun,
    Readiness,
};
use hangar_sdk::{export_plugin, Plugin};
use serde_json::Value;

/// The plugin id, as in `plugin.toml`.
pub const ID: &str = "mlxcel";
/// The engine's program name.
pub const PROGRAM: &str = "mlxcel-server";
/// The manifest, compiled in: the one source of the version requirements
/// and of each setting's capability.
pub const MANIFEST: &str = include_str!("../plugin.toml");

/// Every capability id the manifest declares (`describe()` lists them).
pub const CAPABILITIES: &[&str] = &[
    "speculative",
    "kv_cache_quantization",
    "audio_input",
    "tensor_parallel",
    "paged_attention",
    "distributed_pipeline",
    "zero_config_pipeline",
    "prompt_cache",
    "reasoning_budget",
    "kv_cache_turbo",
    "apc",
    "speculative_mtp",
    "speculative_dflash",
    "kv_cache_budget",
    "split_prefill_decode",
    "offline",
];

/// The plugin's own setting (per model, or in `[plugins.mlxcel]`) for how
/// long the server may take to load a model, in milliseconds.
pub const START_TIMEOUT_MS: &str = "start_timeout_ms";

/// Loading a large model from a slow disk takes minutes; five of them
/// cover a 70B 4-bit checkpoint on an ordinary SSD.
const DEFAULT_START_TIMEOUT_MS: u64 = 300_000;

/// Where the release binaries are published.
const RELEASES: &str = "https://github.com/lablup/mlxcel/releases";

/// The plugin. Every function is pure: it reads what the host sends and
/// answers with data.
pub struct Mlxcel;

impl Plugin for Mlxcel {
    fn describe() -> Description {
        hangar_sdk::describe!(ID, formats: ["mlx"], aliases: {"safetensors" => "mlx"})
            .with_capabilities(CAPABILITIES.iter().copied())
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(probe(&input))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        plan_launch(&request)
    }
}

export_plugin!(Mlxcel);

/// Reads the engine from `mlxcel-server --version`.
///
/// Only an engine that cannot run at all is unavailable: a missing binary
/// (with installation advice) or one the system cannot start (a build for
/// another platform). A probe that exits non-zero, times out or prints
/// something unreadable is *ambiguous*: the engine stays usable with its
/// version unknown, so every gated capability is off, and the detail
/// (shown by `hangar plugins`) says why.
pub fn probe(input: &ProbeInput) -> ProbeReport {
    let report = probe_version(input);
    if !report.available {
        return report;
    }
    match input.surface.as_ref().map(surface::options) {
        Some(Ok(options)) => report.with_flags(options),
        Some(Err(why)) => {
            let detail = match &report.detail {
                Some(detail) => format!("{detail}; {why}, so capabilities follow its version"),
                None => format!("{why}, so capabilities follow its version"),
            };
            report.with_detail(detail)
        }
        None => report,
    }
}

/// The version part of [`probe`].
fn probe_version(input: &ProbeInput) -> ProbeReport {
    let ambiguous = |program: &str, why: String| {
        ProbeReport::available(None)
            .with_program(program.to_string())
            .with_detail(format!(
                "{why}; the version is unknown, so every capability gated on the version is off"
            ))
    };
    let unavailable = |program: Option<&str>, detail: String| {
        let report = ProbeReport::unavailable(detail);
        match program {
            Some(program) => report.with_program(program),
            None => report,
        }
    };
    match &input.run {
        None => unavailable(None, "the manifest names no probe program".into()),
        Some(ProbeRun::NotFound { searched, .. }) => unavailable(
            None,
            format!(
                "{PROGRAM} is not installed (looked in {}). {}",
                searched.join(", "),
                install_advice()
            ),
        ),
        Some(ProbeRun::FailedToStart { program, error, .. }) => unavailable(
            Some(program),
            format!(
                "{program} could not be started ({error}); if it is a build for another platform, replace it. {}",
                install_advice()
            ),
        ),
        Some(ProbeRun::TimedOut { program, after_ms, .. }) => ambiguous(
            program,
            format!("`{program} --version` did not answer within {after_ms} ms"),
        ),
        Some(ProbeRun::Exited {
            program,
            code,
            stdout,
            stderr, ..
        }) => {
            let tail = stderr.lines().rfind(|l| !l.trim().is_empty());
            // 127: the loader found the binary but not its libraries (a
            // Linux CUDA build without CUDA 13's, or moved out of its zip).
            if *code == Some(127) {
                return unavailable(
                    Some(program),
                    format!(
                        "`{program} --version` exited 127, its libraries missing ({}). {}",
                        tail.unwrap_or("no output").trim(),
                        install_advice()
                    ),
                );
            }
            if *code != Some(0) {
                return ambiguous(
                    program,
                    format!(
                        "`{program} --version` failed ({}): {}",
                        code.map_or("killed by a signal".into(), |c| format!("exit code {c}")),
                        tail.unwrap_or("no output").trim()
                    ),
                );
            }
            match version_in(stdout).or_else(|| version_in(stderr)) {
                Some(Ok(version)) => ProbeReport::available(Some(version))
                    .with_program(program.clone()),
                Some(Err(token)) => ambiguous(program, format!("version '{token}' is not semver")),
                None => ambiguous(
                    program,
                    format!(
                        "could not read a version from `{program} --version` ({:?})",
                        stdout.trim().chars().take(80).collect::<String>()
                    ),
                ),
            }
        }
        // An outcome a later host reports: no version can be read from it.
        Some(_) => unavailable(None, "the probe ran in a way this plugin does not know".into()),
    }
}

/// The version in clap's `--version` line (`mlxcel-server 0.4.2`; a `v`
/// prefix is tolerated): `Ok` when it is semver, `Err` with the token when
/// the line is there but its version is not (`nightly-7f3a`).
fn version_in(output: &str) -> Option<Result<String, String>> {
    output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let name = words.next()?;
        let token = words.next()?;
        if !name.starts_with("mlxcel") {
            return None;
        }
        let version = token.strip_prefix('v').unwrap_or(token);
        Some(match semver::Version::parse(version) {
            Ok(v) => Ok(v.to_string()),
            Err(_) => Err(token.to_string()),
        })
    })
}

fn install_advice() -> String {
    format!(
        "Download {PROGRAM} from {RELEASES}: the macOS arm64 (Metal) build, or \
         mlxcel-server-linux-aarch64-cuda13 / mlxcel-server-linux-x86_64-cuda13 on Linux. A \
         release is a zip: unpack it whole and keep the binary beside what it loads \
         (mlx.metallib on macOS; on Linux the bin/ folder with ../include/cccl, ../include/cute and \
         ../include/cutlass), then point Hangar at the unpacked binary with `[plugins.{ID}] program \
         = \"/path/to/{PROGRAM}\"` in config.toml, or link it into PATH or ~/.local/bin"
    )
}

/// The manifest compiled into the plugin.
pub fn manifest() -> Result<&'static Manifest, String> {
    static PARSED: OnceLock<Result<Manifest, String>> = OnceLock::new();
    PARSED
        .get_or_init(|| Manifest::parse(MANIFEST).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| format!("plugin '{ID}' was built with an invalid plugin.toml: {e}"))
}

/// Why `capability` is off for this engine, in the host's words: the
/// plugin, the engine, the versions that have it and the version found.
pub fn off_reason(request: &LoadRequest, capability: &str) -> String {
    let required = manifest()
        .ok()
        .and_then(|m| m.capabilities.get(capability))
        .map_or_else(|| "a newer version".to_string(), ToString::to_string);
    let found = request
        .engine
        .version
        .as_deref()
        .unwrap_or("an unknown version");
    format!("plugin '{ID}' needs {PROGRAM} {required} for {capability}; found {found}")
}

/// Whether the host turned `capability` on for this engine version.
pub fn has(request: &LoadRequest, capability: &str) -> bool {
    request.capabilities.iter().any(|c| c == capability)
}

/// A setting's value; JSON `null` counts as unset, so a layer can clear a
/// value set below it.
pub fn setting<'a>(request: &'a LoadRequest, name: &str) -> Option<&'a Value> {
    request.settings.get(name).filter(|v| !v.is_null())
}

/// The refusal of an invalid setting value, naming the model.
pub fn invalid(request: &LoadRequest, name: &str, value: &Value, reason: &str) -> String {
    format!(
        "model '{}': setting {name} = {value} is invalid: {reason}",
        request.model_id
    )
}

/// A path as the operator wrote it in a setting: `~/` is their home
/// folder, a relative path is taken from the host's working folder (the
/// engine runs in the session's work dir and would read it from there).
pub fn local_path(path: &str) -> PathBuf {
    let expanded = match path.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(|home| Path::new(&home).join(rest))
            .unwrap_or_else(|| PathBuf::from(path)),
        None => PathBuf::from(path),
    };
    std::path::absolute(&expanded).unwrap_or(expanded)
}

/// A model's `config.json`, parsed.
pub fn read_config(folder: &Path) -> Result<Value, String> {
    let path = folder.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
}

/// One setting that becomes command-line flags. Its capability, and the
/// capabilities of single enum values (`turbo4`), come from the manifest.
struct Flag {
    setting: &'static str,
    /// The flags, for notes.
    flags: &'static str,
    /// Renders the flags; the value's type, range and enum membership were
    /// already checked against the manifest's declaration.
    render: fn(&Value) -> Result<Vec<String>, String>,
}

/// `FLAG VALUE`, the value as JSON writes it (numbers and strings alike).
macro_rules! single {
    ($flag:literal) => {
        |v: &Value| Ok(vec![$flag.to_string(), plain(v)])
    };
}

/// Every flag, in the order it appears on the command line.
const FLAGS: &[Flag] = &[
    // Rendered with `parallel` by `slots` (the total is split across them).
    Flag {
        setting: names::CONTEXT_LENGTH,
        flags: "-c",
        render: |_| Ok(vec![]),
    },
    Flag {
        setting: names::MAX_TOKENS,
        flags: "-n",
        render: single!("-n"),
    },
    Flag {
        setting: "parallel",
        flags: "--parallel",
        render: |_| Ok(vec![]),
    },
    Flag {
        setting: "kv_cache_type",
        flags: "--cache-type-k/--cache-type-v",
        render: |v| {
            let t = plain(v);
            Ok(vec![
                "--cache-type-k".into(),
                t.clone(),
                "--cache-type-v".into(),
                t,
            ])
        },
    },
    Flag {
        setting: names::KV_BITS,
        flags: "--kv-bits/--kv-quant-scheme",
        // mlxcel validates the pair at start-up (BatchKvQuantConfig::validate
        // in src/lib/mlxcel-core/src/cache/batch_quant.rs): 8 with the
        // default uniform scheme, 4 only with `--kv-quant-scheme turboquant`.
        render: |v| match v.as_u64() {
            Some(8) => Ok(vec!["--kv-bits".into(), "8".into()]),
            Some(4) => Ok(vec![
                "--kv-bits".into(),
                "4".into(),
                "--kv-quant-scheme".into(),
                "turboquant".into(),
            ]),
            _ => Err(format!(
                "{PROGRAM} takes 8 (uniform) or 4 (TurboQuant) KV bits and refuses any other count"
            )),
        },
    },
    Flag {
        setting: "decode_storage",
        flags: "--decode-storage-backend",
        render: single!("--decode-storage-backend"),
    },
    Flag {
        setting: "prompt_cache",
        flags: "--prompt-cache-enabled/--no-prompt-cache",
        // `--prompt-cache-enabled` takes its value only as `=BOOL`
        // (require_equals); off is `--no-prompt-cache` from 0.4.0, which
        // `plan_launch` spells `--prompt-cache-enabled=false` before it.
        render: |v| {
            Ok(vec![if v.as_bool() == Some(true) {
                "--prompt-cache-enabled=true".into()
            } else {
                "--no-prompt-cache".into()
            }])
        },
    },
    Flag {
        setting: "prompt_cache_capacity_bytes",
        flags: "--prompt-cache-capacity-bytes",
        render: single!("--prompt-cache-capacity-bytes"),
    },
    Flag {
        setting: "prompt_cache_ttl",
        flags: "--prompt-cache-ttl",
        render: single!("--prompt-cache-ttl"),
    },
    Flag {
        setting: "apc",
        flags: "--apc-enabled",
        // APC is on by default; its flag takes a value only as `=BOOL`
        // (require_equals: mlxcel's src/bin/mlx_server.rs), so off is
        // `--apc-enabled=false`.
        render: |v| Ok(vec![format!("--apc-enabled={}", v.as_bool() == Some(true))]),
    },
    Flag {
        setting: "apc_block_size",
        flags: "--apc-block-size",
        render: single!("--apc-block-size"),
    },
    Flag {
        setting: "reasoning_budget",
        flags: "--reasoning-budget",
        // `=`: builds before mlxcel #1459 read `--reasoning-budget -1` as
        // a flag named `-1`; every build parses `--reasoning-budget=-1`.
        render: |v| Ok(vec![format!("--reasoning-budget={}", plain(v))]),
    },
    Flag {
        setting: "tensor_parallel_size",
        flags: "--tp-size",
        render: |v| match v.as_u64() {
            Some(n) if n.is_power_of_two() => Ok(vec!["--tp-size".into(), n.to_string()]),
            _ => Err("mlxcel shards across a power of 2 of ranks (1, 2, 4, 8, …)".into()),
        },
    },
    Flag {
        setting: "kv_cache_budget",
        flags: "--kv-cache-budget",
        render: |v| match v.as_str() {
            Some(b)
                if b == "auto"
                    || b == "none"
                    || (!b.is_empty() && b.bytes().all(|c| c.is_ascii_digit())) =>
            {
                Ok(vec!["--kv-cache-budget".into(), b.into()])
            }
            _ => Err(
                "it must be \"auto\", \"none\" or a whole number of bytes such as \"8589934592\""
                    .into(),
            ),
        },
    },
    Flag {
        setting: "chat_template_kwargs",
        flags: "--chat-template-kwargs",
        render: |v| Ok(vec!["--chat-template-kwargs".into(), v.to_string()]),
    },
];

/// A value as a command-line word: strings without their quotes.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The fewest context tokens mlxcel-server starts with per slot.
pub const MIN_CTX_PER_SLOT: u64 = 512;

/// Whether the probed version is at least `version` (an unknown version
/// is taken as the newest: gated flags are off for it anyway).
fn at_least(request: &LoadRequest, version: (u64, u64, u64)) -> bool {
    match request
        .engine
        .version
        .as_deref()
        .map(semver::Version::parse)
    {
        Some(Ok(v)) => (v.major, v.minor, v.patch) >= version,
        _ => true,
    }
}

/// `-c TOTAL --parallel N`: from 0.0.30 mlxcel splits one `--ctx-size`
/// across its `--parallel` slots (4 by default from 0.4.0, 1 before), so a
/// session gets `context_length` only when the total is that many times
/// the slots, and it refuses to start with fewer than 512 tokens per slot,
/// which is refused here before launch, naming the setting. Before 0.0.30
/// every slot had the whole `--ctx-size` (mlxcel's CHANGELOG, v0.0.30).
fn slots(request: &LoadRequest) -> Result<Vec<String>, String> {
    let parallel = setting(request, "parallel").and_then(Value::as_u64);
    let Some(value) = setting(request, names::CONTEXT_LENGTH) else {
        return Ok(parallel
            .map(|n| vec!["--parallel".to_string(), n.to_string()])
            .unwrap_or_default());
    };
    let per_slot = value.as_u64().unwrap_or(0);
    let shared = at_least(request, (0, 0, 30));
    if shared && per_slot < MIN_CTX_PER_SLOT {
        return Err(invalid(
            request,
            names::CONTEXT_LENGTH,
            value,
            &format!("{PROGRAM} refuses fewer than {MIN_CTX_PER_SLOT} tokens per slot"),
        ));
    }
    let slots = parallel.unwrap_or(if at_least(request, (0, 4, 0)) { 4 } else { 1 });
    let total = if shared { per_slot * slots } else { per_slot };
    Ok(vec![
        "-c".into(),
        total.to_string(),
        "--parallel".into(),
        slots.to_string(),
    ])
}

/// mlxcel-server refuses to start a remote pipeline (a cluster file with
/// `pipeline_parallel_size` above 1) with a drafter or with tensor
/// parallelism (`resolve_remote_pipeline_topology` in its
/// src/server/startup.rs); the plan refuses the same pair first, naming
/// both settings.
fn refuse_with_remote_pipeline(
    request: &LoadRequest,
    args: &[String],
    drafting: bool,
    stages: usize,
) -> Result<(), String> {
    if stages < 2 {
        return Ok(());
    }
    let tensor_parallel = args
        .windows(2)
        .any(|pair| pair[0] == "--tp-size" && pair[1] != "1");
    let clash = if drafting {
        Some((names::DRAFT_MODEL, "speculative decoding"))
    } else if tensor_parallel {
        Some(("tensor_parallel_size", "tensor parallelism"))
    } else {
        None
    };
    match clash {
        None => Ok(()),
        Some((name, what)) => Err(format!(
            "model '{}': setting {name} cannot be combined with setting pipeline: {PROGRAM}'s remote pipeline ({stages} stages) refuses {what} at start-up; remove one of the two settings",
            request.model_id
        )),
    }
}

/// Plans `mlxcel-server` for one model.
pub fn plan_launch(request: &LoadRequest) -> Result<LaunchPlan, String> {
    let manifest = manifest()?;
    let model = &request.model_id;
    if request.format != "mlx" {
        return Err(format!(
            "model '{model}': plugin '{ID}' serves the mlx format, not '{}'",
            request.format
        ));
    }
    // mlxcel-server downloads a `-m` that is not an existing folder from
    // the hub; the plan only ever names an existing one.
    let model_path = local_path(&request.model_path);
    if !model_path.join("config.json").is_file() {
        return Err(format!(
            "model '{model}': {} is not a model folder with a config.json; {PROGRAM} serves MLX model folders (config.json, tokenizer, *.safetensors)",
            model_path.display()
        ));
    }
    let model_path = model_path.display().to_string();
    let mut args: Vec<String> = vec![
        "--model".into(),
        model_path.clone(),
        "--alias".into(),
        model.clone(),
        "--host".into(),
        request.host.clone(),
        "--port".into(),
        request.port.to_string(),
    ];
    // The engine otherwise fetches the media URLs a request names (and a
    // model reference it cannot find locally): `--offline` stops both.
    if has(request, "offline") {
        args.push("--offline".into());
    }
    let mut notes = Vec::new();
    // Settings this table does not name (the host's own, and the ones the
    // modules below handle) are left alone here.
    for flag in FLAGS {
        let Some(value) = setting(request, flag.setting) else {
            continue;
        };
        let spec = manifest.setting(flag.setting).ok_or_else(|| {
            format!(
                "plugin '{ID}' maps setting '{}' but plugin.toml does not declare it",
                flag.setting
            )
        })?;
        if let Some(capability) = spec.capability.as_deref().filter(|c| !has(request, c)) {
            notes.push(format!(
                "setting '{}' was not applied ({}): {}",
                flag.setting,
                flag.flags,
                off_reason(request, capability)
            ));
            continue;
        }
        let value_capability = spec
            .values
            .iter()
            .find(|v| Some(v.value()) == value.as_str())
            .and_then(|v| v.capability())
            .filter(|c| !has(request, c));
        if let Some(capability) = value_capability {
            notes.push(format!(
                "setting {} = {value} was not applied ({}): {}",
                flag.setting,
                flag.flags,
                off_reason(request, capability)
            ));
            continue;
        }
        spec.check(value, |_| true)
            .map_err(|e| format!("model '{model}': {e}"))?;
        let mut rendered = (flag.render)(value)
            .map_err(|reason| invalid(request, flag.setting, value, &reason))?;
        let no_prompt_cache = request
            .engine
            .accepts("--no-prompt-cache")
            .unwrap_or_else(|| at_least(request, (0, 4, 0)));
        if rendered == ["--no-prompt-cache"] && !no_prompt_cache {
            rendered = vec!["--prompt-cache-enabled=false".into()];
        }
        args.extend(rendered);
    }
    args.extend(slots(request)?);
    let speculative = drafter::plan(request, Path::new(&model_path))?;
    let drafting = !speculative.args.is_empty();
    args.extend(speculative.args);
    notes.extend(speculative.notes);
    let mut files = std::collections::BTreeMap::new();
    if let Some(value) = setting(request, "pipeline") {
        if has(request, "distributed_pipeline") {
            let planned = pipeline::plan(request, Path::new(&model_path), value)?;
            refuse_with_remote_pipeline(request, &args, drafting, planned.stages)?;
            args.extend(planned.args);
            notes.extend(planned.notes);
            files.insert(pipeline::FILE.to_string(), planned.config);
        } else {
            notes.push(format!(
                "setting 'pipeline' was not applied, the model is served on this machine alone: {}",
                off_reason(request, "distributed_pipeline")
            ));
        }
    }
    let start_timeout_ms = match setting(request, START_TIMEOUT_MS)
        .or_else(|| request.plugin_settings.get(START_TIMEOUT_MS))
    {
        None => DEFAULT_START_TIMEOUT_MS,
        Some(value) => value.as_u64().filter(|&ms| ms > 0).ok_or_else(|| {
            invalid(
                request,
                START_TIMEOUT_MS,
                value,
                "it must be a whole number of milliseconds above 0",
            )
        })?,
    };
    Ok(LaunchPlan::new(
        request
            .engine
            .program
            .clone()
            .unwrap_or_else(|| PROGRAM.into()),
        args,
    )
    // With warm-up on (the default) mlxcel-server opens its port only once
    // the model is loaded, and a load that fails leaves it up answering
    // 503 (it logs "Failed to load model"): a 503 at start is a failed load,
    // and the fallback engine starts at once instead of after the start
    // timeout. Once serving, older builds answer 503 "no slot available"
    // when every slot is taken: busy, not failed.
    .with_readiness(
        Readiness::new("/health")
            .with_failed_statuses([503])
            .with_busy_statuses([503]),
    )
    .with_start_timeout_ms(start_timeout_ms)
    // mlxcel-server reads LLAMA_ARG_* (its flags), LLAMA_API_KEY (adds API
    // keys) and MLXCEL_* from its environment: none of the host's reaches
    // it, so only this plan decides how it runs.
    .with_env_remove_prefixes(["LLAMA_", "MLXCEL_"])
    // `--alias` makes the served model's name the model id.
    .with_upstream_model(model.clone())
    .with_notes(notes)
    .with_files(files))
}
