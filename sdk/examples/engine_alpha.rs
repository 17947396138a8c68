//! Example plugin `alpha`: serves `mlx` (and aliases `safetensors` to it),
//! with two version-gated capabilities. Its engine prints `alpha X.Y.Z`;
//! the launch plan runs the program the probe resolved.

use hangar_sdk::wire::{
    Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Protocol, Readiness,
};
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
        Ok(LaunchPlan {
            program: request.engine.program.unwrap_or_else(|| "alpha".into()),
            args: vec![
                "--model".into(),
                request.model_path,
                "--port".into(),
                request.port.to_string(),
            ],
            env: Default::default(),
            cwd: None,
            readiness: Readiness {
                health_path: "/health".into(),
                ready_status: 200,
                warmup: None,
                failed_statuses: vec![],
            },
            start_timeout_ms: 10_000,
            protocol: Protocol::OpenaiHttp,
            upstream_model: None,
            notes: vec![],
            files: Default::default(),
            ranks: Vec::new(),
        })
    }
}

export_plugin!(Alpha);
