//! What "the same greedy tokens" means on the device the tests run on.
//!
//! On the CPU a row's result does not depend on the shapes around it (a
//! batch's padded attention, a cache copied or reused), so every path gives
//! the session's ids, bit for bit, and the tests ask for that. A GPU's
//! kernels may add up in another order for other shapes; greedy ids then
//! part where two tokens are all but tied, as mlx-lm's own batched and
//! unbatched paths do. There, each id must be the session's greedy choice
//! after the same ids before it, or within a rounding's worth of it.

use std::sync::OnceLock;

use hangar_native_mlx::{probe, DeviceKind, Session};

use crate::fixtures::fixtures;

/// How far below the session's greedy choice (in nats) a token of another
/// path may be on a GPU, by the model's activation dtype: about a hundred
/// times the last bit of its logits' largest values.
fn near_tie(model: &str) -> f32 {
    let config = std::fs::read_to_string(fixtures().model(model).join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    match config["torch_dtype"].as_str() {
        Some("bfloat16" | "float16") => 0.25,
        _ => 0.01,
    }
}

fn on_gpu() -> bool {
    static GPU: OnceLock<bool> = OnceLock::new();
    *GPU.get_or_init(|| probe().expect("MLX answers").device == DeviceKind::Gpu)
}

/// Asserts that `got`, the greedy ids of `prompt` on `model` by one path,
/// are `expected`, another path's: the same ids on the CPU; on a GPU the
/// same ids, or where they part, each of both within [`near_tie`] of the
/// session's greedy choice (which is printed, with the largest gap).
pub fn assert_same_greedy(model: &str, prompt: &[u32], got: &[u32], expected: &[u32], what: &str) {
    if !on_gpu() || got == expected {
        assert_eq!(got, expected, "{what}");
        return;
    }
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let part = got.iter().zip(expected).position(|(a, b)| a != b);
    let near = near_tie(model);
    let mut session = Session::load(&fixtures().model(model)).unwrap();
    for (name, ids) in [("got", got), ("expected", expected)] {
        let scores = session.score(prompt, ids).unwrap();
        let (at, worst) = scores
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.gap().total_cmp(&b.1.gap()))
            .expect("some ids");
        eprintln!(
            "{what}: ids part at token {part:?}; {name}'s largest gap below the session's \
             greedy choice is {:.3e} nats, at token {at} ({worst:?}; tolerance {near})",
            worst.gap()
        );
        assert!(
            worst.gap() <= near,
            "{what}: {name}'s token {at} is not a near tie of the session's greedy choice: {worst:?}"
        );
    }
}
