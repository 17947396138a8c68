//! Example plugin `gamma`: serves `mlx` and declares the capabilities the
//! host gates chat requests on (`reasoning_effort`, `audio_input`,
//! `vision`); which
//! of them are on follows the manifest's requirements and the version its
//! engine prints (`gamma X.Y.Z`). Its engine process is the Python script
//! the operator's config names (`script`), run with `--port N` and ready
//! on `/health`: the request-gate tests' stand-in that answers with the
//! request it got.

use hangar_sdk::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Readiness};
use hangar_sdk::{export_plugin, Plugin};

struct Gamma;

impl Plugin for Gamma {
    fn describe() -> Description {
        hangar_sdk::describe!("gamma", formats: ["mlx"],
            capabilities: ["reasoning_effort", "audio_input", "vision"])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.lines().next()?.strip_prefix("gamma ").map(str::trim)
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let script = request
            .plugin_settings
            .get("script")
            .and_then(|s| s.as_str())
            .ok_or("plugin 'gamma' needs `script` (a Python engine) in its config")?;
        Ok(LaunchPlan::new(
            "python3",
            vec![script.into(), "--port".into(), request.port.to_string()],
        )
        .with_readiness(Readiness::new("/health"))
        .with_start_timeout_ms(20_000))
    }
}

export_plugin!(Gamma);
