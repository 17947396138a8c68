//! Example plugin whose code panics in `describe()`; the SDK's guard must
//! turn that into an error and the host must stay up.

use hangar_sdk::wire::{Description, ProbeInput, ProbeReport};
use hangar_sdk::{export_plugin, Plugin};

struct Panics;

impl Plugin for Panics {
    fn describe() -> Description {
        panic!("the engine adapter is broken")
    }

    fn probe(_input: ProbeInput) -> Result<ProbeReport, String> {
        panic!("unreachable: describe() fails first")
    }
}

export_plugin!(Panics);
