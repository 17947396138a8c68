//! `{{id}}`: a Hangar engine plugin for `{{id}}-server`, an engine that
//! serves the OpenAI HTTP API for GGUF models.
//!
//! The host runs `{{id}}-server --version` (plugin.toml's `[probe]`) and
//! hands the output to `probe()`. For each model it asks `plan_launch()`
//! how to start the server, starts it, waits for `GET /health`, and
//! proxies requests to it. The plugin itself never runs anything.

use hangar_sdk::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Readiness};
use hangar_sdk::{export_plugin, Plugin};

/// The engine program, declared under `programs` in plugin.toml.
const PROGRAM: &str = "{{id}}-server";

/// The plugin: pure functions from what the host sends to what it needs.
pub struct Engine;

impl Plugin for Engine {
    fn describe() -> Description {
        hangar_sdk::describe!("{{id}}", formats: ["gguf"], capabilities: ["prompt_cache"])
    }

    /// `{{id}}-server --version` prints `{{id}}-server 1.2.3`.
    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.strip_prefix(PROGRAM)?.split_whitespace().next()
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let setting = |name: &str| request.settings.get(name).and_then(|v| v.as_u64());
        let mut args = vec![
            "--model".to_string(),
            request.model_path.clone(),
            "--host".into(),
            request.host.clone(),
            "--port".into(),
            request.port.to_string(),
        ];
        if let Some(tokens) = setting("context_length") {
            args.extend(["--ctx-size".into(), tokens.to_string()]);
        }
        // On only where the probed version has the capability.
        if request.capabilities.iter().any(|c| c == "prompt_cache") {
            if let Some(entries) = setting("prompt_cache_size") {
                args.extend(["--prompt-cache".into(), entries.to_string()]);
            }
        }
        // The path the probe resolved, else the declared name.
        let program = request.engine.program.unwrap_or_else(|| PROGRAM.into());
        // A constructor and `with_*` builders, never a struct literal: the
        // messages are `#[non_exhaustive]`, so a plugin-api 1.x release can
        // add a field without breaking this source.
        Ok(LaunchPlan::new(program, args)
            .with_readiness(Readiness::new("/health").with_busy_statuses([503]))
            .with_start_timeout_ms(120_000))
    }
}

export_plugin!(Engine);
