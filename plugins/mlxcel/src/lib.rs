//! Hangar plugin for Lablup's `mlxcel-server`, the preferred engine for
//! MLX models.
//!
//! The probe reads `mlxcel-server --version`; plan_launch maps Hangar's
//! settings to the server's flags, each only when the probed version has
//! the capability behind it (an old binary never sees a flag it does not
//! know), picks and checks speculative drafters ([`drafter`]) and plans
//! pipeline serving across machines ([`pipeline`]).

pub mod drafter;
pub mod pipeline;
#[cfg(test)]
mod tests;

use std::path::Path;

use hangar_sdk::wire::{
    settings as names, Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun,
    Protocol, Readiness,
};
use hangar_sdk::{export_plugin, Plugin};
use serde_json::Value;

/// The plugin id.
pub const ID: &str = "mlxcel";
/// The engine's program name.
pub const PROGRAM: &str = "mlxcel-server";
/// The manifest, compiled in so that notes can quote its requirements.
pub const MANIFEST: &str = include_str!("../plugin.toml");

/// Every capability id the manifest declares.
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
];

struct Mlxcel;

impl Plugin for Mlxcel {
    fn describe() -> Description {
        let mut d = hangar_sdk::describe!(ID, formats: ["mlx"], aliases: {"safetensors" => "mlx"});
        d.capabilities = CAPABILITIES.iter().map(|c| c.to_string()).collect();
        d
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(probe(&input))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        plan_launch(&request)
    }
}

export_plugin!(Mlxcel);

/// Reads the engine from `mlxcel-server --version`. Only a missing binary
/// makes the engine unavailable; a probe that fails, times out or prints
/// something unparseable leaves it usable with its version unknown (so
/// every gated capability is off), and says why.
pub fn probe(input: &ProbeInput) -> ProbeReport {
    let report = hangar_sdk::version_from_output(input, |out| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix("mlxcel-server "))
            .map(str::trim)
    });
    match &input.run {
        Some(ProbeRun::NotFound { searched }) => ProbeReport {
            detail: Some(format!(
                "mlxcel-server is not installed (looked in {}); download a release asset (macOS arm64, linux-aarch64-cuda13, linux-x86_64-cuda13) and put it on PATH or set [plugins.mlxcel] program",
                searched.join(", ")
            )),
            ..report
        },
        Some(ProbeRun::Exited { program, code, stderr, .. }) if *code != Some(0) => ProbeReport {
            available: true,
            version: None,
            program: Some(program.clone()),
            device: None,
            detail: Some(format!(
                "`{program} --version` failed ({}): {}; the version is unknown, so every gated capability is off",
                code.map_or("killed by a signal".into(), |c| format!("exit code {c}")),
                stderr.lines().last().unwrap_or("").trim()
            )),
        },
        _ => report,
    }
}

/// The manifest's requirement for `capability` (`>=0.0.26`).
pub fn requirement(capability: &str) -> String {
    let manifest: toml::Table = toml::from_str(MANIFEST).expect("the manifest is valid TOML");
    manifest
        .get("capabilities")
        .and_then(|c| c.get(capability))
        .and_then(|r| r.as_str())
        .unwrap_or("a newer version")
        .to_string()
}

/// Why `capability` is off for this engine, in words.
pub fn off_reason(request: &LoadRequest, capability: &str) -> String {
    format!(
        "{PROGRAM} {} is needed for {capability}; found {}",
        requirement(capability),
        request
            .engine
            .version
            .as_deref()
            .unwrap_or("an unknown version")
    )
}

/// A setting's value; JSON `null` counts as unset.
fn setting<'a>(request: &'a LoadRequest, name: &str) -> Option<&'a Value> {
    request.settings.get(name).filter(|v| !v.is_null())
}

/// One setting that maps to flags.
struct Flag {
    setting: &'static str,
    capability: Option<&'static str>,
    flags: fn(&Value) -> Result<Vec<String>, String>,
}

fn integer(
    name: &'static str,
    flag: &'static str,
) -> impl Fn(&Value) -> Result<Vec<String>, String> {
    move |v| match v.as_i64() {
        Some(n) => Ok(vec![flag.into(), n.to_string()]),
        None => Err(format!("setting '{name}' must be a whole number, not {v}")),
    }
}

const FLAGS: &[Flag] = &[
    Flag {
        setting: names::CONTEXT_LENGTH,
        capability: None,
        flags: |v| integer(names::CONTEXT_LENGTH, "-c")(v),
    },
    Flag {
        setting: names::MAX_TOKENS,
        capability: None,
        flags: |v| integer(names::MAX_TOKENS, "-n")(v),
    },
    Flag {
        setting: "parallel",
        capability: None,
        flags: |v| integer("parallel", "--parallel")(v),
    },
    Flag {
        setting: "kv_cache_type",
        capability: Some("kv_cache_quantization"),
        flags: |v| match v.as_str() {
            Some(t @ ("fp16" | "int8" | "turbo4")) => Ok(vec![
                "--cache-type-k".into(),
                t.into(),
                "--cache-type-v".into(),
                t.into(),
            ]),
            _ => Err(format!(
                "setting 'kv_cache_type' must be fp16, int8 or turbo4, not {v}"
            )),
        },
    },
    Flag {
        setting: "kv_bits",
        capability: Some("kv_cache_turbo"),
        flags: |v| integer("kv_bits", "--kv-bits")(v),
    },
    Flag {
        setting: "decode_storage",
        capability: Some("paged_attention"),
        flags: |v| match v.as_str() {
            Some(s @ ("auto" | "dense" | "paged")) => {
                Ok(vec!["--decode-storage-backend".into(), s.into()])
            }
            _ => Err(format!(
                "setting 'decode_storage' must be auto, dense or paged, not {v}"
            )),
        },
    },
    Flag {
        setting: "prompt_cache",
        capability: Some("prompt_cache"),
        flags: |v| match v.as_bool() {
            Some(true) => Ok(vec!["--prompt-cache-enabled".into()]),
            Some(false) => Ok(vec!["--no-prompt-cache".into()]),
            None => Err(format!(
                "setting 'prompt_cache' must be true or false, not {v}"
            )),
        },
    },
    Flag {
        setting: "prompt_cache_capacity_bytes",
        capability: Some("prompt_cache"),
        flags: |v| {
            integer(
                "prompt_cache_capacity_bytes",
                "--prompt-cache-capacity-bytes",
            )(v)
        },
    },
    Flag {
        setting: "prompt_cache_ttl",
        capability: Some("prompt_cache"),
        flags: |v| integer("prompt_cache_ttl", "--prompt-cache-ttl")(v),
    },
    Flag {
        setting: "apc",
        capability: Some("apc"),
        flags: |v| match v.as_bool() {
            Some(true) => Ok(vec!["--apc-enabled".into()]),
            Some(false) => Ok(vec![]),
            None => Err(format!("setting 'apc' must be true or false, not {v}")),
        },
    },
    Flag {
        setting: "apc_block_size",
        capability: Some("apc"),
        flags: |v| integer("apc_block_size", "--apc-block-size")(v),
    },
    Flag {
        setting: "reasoning_budget",
        capability: Some("reasoning_budget"),
        flags: |v| match v.as_i64() {
            Some(n) if n >= -1 => Ok(vec!["--reasoning-budget".into(), n.to_string()]),
            _ => Err(format!(
                "setting 'reasoning_budget' must be -1 (unlimited), 0 (none) or more, not {v}"
            )),
        },
    },
    Flag {
        setting: "tensor_parallel_size",
        capability: Some("tensor_parallel"),
        flags: |v| integer("tensor_parallel_size", "--tp-size")(v),
    },
    Flag {
        setting: "kv_cache_budget",
        capability: Some("kv_cache_budget"),
        flags: |v| match v.as_str() {
            Some(b)
                if b == "auto"
                    || b == "none"
                    || (!b.is_empty() && b.bytes().all(|c| c.is_ascii_digit())) =>
            {
                Ok(vec!["--kv-cache-budget".into(), b.into()])
            }
            _ => Err(format!(
                "setting 'kv_cache_budget' must be a byte count, auto or none, not {v}"
            )),
        },
    },
    Flag {
        setting: "chat_template_kwargs",
        capability: None,
        flags: |v| match v {
            Value::Object(_) => Ok(vec!["--chat-template-kwargs".into(), v.to_string()]),
            _ => Err(format!(
                "setting 'chat_template_kwargs' must be an object, not {v}"
            )),
        },
    },
];

/// Plans `mlxcel-server` for one model.
pub fn plan_launch(request: &LoadRequest) -> Result<LaunchPlan, String> {
    let model = &request.model_id;
    if request.format != "mlx" {
        return Err(format!(
            "plugin '{ID}' serves the mlx format, not '{}'",
            request.format
        ));
    }
    let model_path = Path::new(&request.model_path);
    if !model_path.join("config.json").is_file() {
        return Err(format!(
            "model '{model}': {} has no config.json; mlxcel-server serves MLX model folders",
            model_path.display()
        ));
    }
    let has = |capability: &str| request.capabilities.iter().any(|c| c == capability);
    let mut args: Vec<String> = vec![
        "--model".into(),
        request.model_path.clone(),
        "--alias".into(),
        model.clone(),
        "--host".into(),
        request.host.clone(),
        "--port".into(),
        request.port.to_string(),
    ];
    let mut notes = Vec::new();
    for flag in FLAGS {
        let Some(value) = setting(request, flag.setting) else {
            continue;
        };
        if let Some(capability) = flag.capability.filter(|c| !has(c)) {
            notes.push(format!(
                "setting '{}' was not applied: {}",
                flag.setting,
                off_reason(request, capability)
            ));
            continue;
        }
        if flag.setting == "kv_cache_type"
            && value.as_str() == Some("turbo4")
            && !has("kv_cache_turbo")
        {
            notes.push(format!(
                "kv_cache_type turbo4 was not applied: {}",
                off_reason(request, "kv_cache_turbo")
            ));
            continue;
        }
        args.extend((flag.flags)(value)?);
    }
    let (draft_args, draft_note) = drafter::plan(request)?;
    args.extend(draft_args);
    notes.extend(draft_note);
    let mut files = std::collections::BTreeMap::new();
    if let Some(value) = setting(request, "pipeline") {
        if has("distributed_pipeline") {
            let planned = pipeline::plan(request, value)?;
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
    let start_timeout_ms = setting(request, "start_timeout_ms")
        .and_then(Value::as_u64)
        .unwrap_or(300_000);
    Ok(LaunchPlan {
        program: request
            .engine
            .program
            .clone()
            .unwrap_or_else(|| PROGRAM.into()),
        args,
        env: Default::default(),
        cwd: None,
        // /health answers 503 "loading model" until the model is in memory
        // (and 503 "no slot available" when busy): only 200 means ready,
        // and no 503 means the load failed.
        readiness: Readiness {
            health_path: "/health".into(),
            ready_status: 200,
            warmup: None,
            failed_statuses: vec![],
        },
        start_timeout_ms,
        protocol: Protocol::OpenaiHttp,
        upstream_model: Some(model.clone()),
        notes,
        files,
    })
}
