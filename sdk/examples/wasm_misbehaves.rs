//! Example plugin `misbehaves`, built for WebAssembly by the host's tests:
//! its `plan_launch()` misbehaves as the model's name asks, so the tests can
//! check that the sandbox stops it and the host keeps serving.
//!
//! - `spin…`: loops forever;
//! - `trap…`: panics (a WebAssembly guest traps on a panic);
//! - `hog…`: allocates without bound;
//! - anything else: plans Python's `http.server`, as `beta` does.

use hangar_sdk::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Readiness};
use hangar_sdk::{export_plugin, Plugin};

struct Misbehaves;

impl Plugin for Misbehaves {
    fn describe() -> Description {
        hangar_sdk::describe!("misbehaves", formats: ["gguf"])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.lines().next()?.strip_prefix("beta ").map(str::trim)
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let model = request.model_id.as_str();
        if model.starts_with("spin") {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        if model.starts_with("trap") {
            panic!("the adapter cannot plan {model}");
        }
        if model.starts_with("hog") {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1; 1 << 20]);
                std::hint::black_box(&hoard);
            }
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

export_plugin!(Misbehaves);
