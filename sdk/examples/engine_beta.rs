//! Example plugin `beta`: serves `mlx` and `gguf` with no gated
//! capabilities. Its engine prints `beta X.Y.Z`; the engine process it
//! launches is Python's `http.server`, which stands in for an engine that
//! serves HTTP (the supervisor tests start, watch and kill it), or, when
//! the operator's config names a `script` for it, that Python script with
//! `--port N`, readiness on `/health` and 503 meaning failed (the health
//! tests' stand-in for an engine that hangs or turns unhealthy).

use hangar_sdk::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Readiness};
use hangar_sdk::{export_plugin, Plugin};

struct Beta;

impl Plugin for Beta {
    fn describe() -> Description {
        hangar_sdk::describe!("beta", formats: ["mlx", "gguf"])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.lines().next()?.strip_prefix("beta ").map(str::trim)
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        if let Some(script) = request
            .plugin_settings
            .get("script")
            .and_then(|s| s.as_str())
        {
            return Ok(LaunchPlan::new(
                "python3",
                vec![script.into(), "--port".into(), request.port.to_string()],
            )
            .with_readiness(Readiness::new("/health").with_failed_statuses(vec![503]))
            .with_start_timeout_ms(20_000));
        }
        Ok(LaunchPlan::new(
            "python3",
            vec![
                "-m".into(),
                "http.server".into(),
                request.port.to_string(),
                "--bind".into(),
                request.host,
            ],
        )
        .with_readiness(Readiness::new("/"))
        .with_start_timeout_ms(20_000))
    }
}

export_plugin!(Beta);
