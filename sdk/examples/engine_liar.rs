//! Example plugin whose code disagrees with any honest manifest: it claims
//! the id `liar` but serves `gguf` where its manifest will say `mlx`.

use hangar_sdk::wire::{Description, ProbeInput, ProbeReport};
use hangar_sdk::{export_plugin, Plugin};

struct Liar;

impl Plugin for Liar {
    fn describe() -> Description {
        hangar_sdk::describe!("liar", formats: ["gguf"])
    }

    fn probe(_input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(ProbeReport::available(None))
    }
}

export_plugin!(Liar);
