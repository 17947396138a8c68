//! Example plugin `alpha`: serves `mlx` (and aliases `safetensors` to it),
//! with two version-gated capabilities. Its engine prints `alpha X.Y.Z`;
//! the launch plan runs the program the probe resolved.

use hangar_sdk::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Readiness};
use hangar_sdk::{export_plugin, Plugin};

struct Alpha;

impl Plugin for Alpha {
    fn describe() -> Description {
        hangar_sdk::describe!("alpha", formats: ["mlx"],
            aliases: {"safetensors" => "mlx"},
            capabilities: ["kv_cache_quantization", "paged_attention"])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.lines().next()?.strip_prefix("alpha ").map(str::trim)
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        Ok(LaunchPlan::new(
            request.engine.program.unwrap_or_else(|| "alpha".into()),
            vec![
                "--model".into(),
                request.model_path,
                "--port".into(),
                request.port.to_string(),
            ],
        )
        .with_readiness(Readiness::new("/health"))
        .with_start_timeout_ms(10_000))
    }
}

export_plugin!(Alpha);
