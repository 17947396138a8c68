//! Example plugin `alpha`: serves `mlx` (and aliases `safetensors` to it),
//! with two version-gated capabilities. Its engine prints `alpha X.Y.Z`.

use hangar_sdk::wire::{Description, ProbeInput, ProbeReport};
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
}

export_plugin!(Alpha);
