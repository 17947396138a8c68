//! Example plugin `beta`: serves `mlx` and `gguf` with no gated
//! capabilities. Its engine prints `beta X.Y.Z`.

use hangar_sdk::wire::{Description, ProbeInput, ProbeReport};
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
}

export_plugin!(Beta);
