//! What "the same greedy tokens" (and the same seeded draws) means on the device the tests run on.
//!
//! On the CPU a row's result does not depend on the shapes around it (a
//! batch's padded attention, a cache copied or reused), so every path gives
//! the session's ids, bit for bit, and the tests ask for that. A GPU's
//! kernels may add up in another order for other shapes; greedy ids then
//! part where two tokens are all but tied, as mlx-lm's own batched and
//! unbatched paths do. There, each id must be the session's greedy choice
//! after the same ids before it, or within a rounding's worth of it. A
//! seeded draw parts the same way where it falls on the border of two
//! tokens' shares; there each id must be what the session's draw takes, or
//! within a rounding's worth of the draw.

use std::sync::OnceLock;

use hangar_native_mlx::{probe, DeviceKind, SamplingParams, Session};

use crate::fixtures::fixtures;

/// How far below the session's greedy choice (in nats) a token of another
/// path may be on a GPU, by the model's activation dtype: about a hundred
/// times the last bit of its logits' largest values.
fn near_tie(model: &str) -> f32 {
    near_tie_at(&fixtures().model(model))
}

/// [`near_tie`] of the model folder `dir`.
pub fn near_tie_at(dir: &std::path::Path) -> f32 {
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    match config["torch_dtype"].as_str() {
        Some("bfloat16" | "float16") => 0.25,
        _ => 0.01,
    }
}

/// How far two paths' float32 results may differ: `cpu` on the CPU; on a
/// GPU, where MLX multiplies float32 as TF32 (10 bits of mantissa) unless
/// `MLX_ENABLE_TF32=0`, one TF32 step of the `largest` value, if that is
/// more.
pub fn float32_tolerance(cpu: f32, largest: f32) -> f32 {
    let tf32 = std::env::var("MLX_ENABLE_TF32").map_or(true, |v| v != "0");
    if on_gpu() && tf32 {
        cpu.max(largest * 2f32.powi(-10))
    } else {
        cpu
    }
}

/// Whether MLX's default device is a GPU.
pub fn on_gpu() -> bool {
    static GPU: OnceLock<bool> = OnceLock::new();
    *GPU.get_or_init(|| probe().expect("MLX answers").device == DeviceKind::Gpu)
}

/// Checks that `got`, the ids of `prompt` on `model` by one path (greedy,
/// or drawn with a seeded `sampling`), are `expected`, another path's: the
/// same ids on the CPU; on a GPU the same ids, or where they part, each of
/// both within [`near_tie`] of what the session takes after the same ids
/// before it (its greedy choice, or its seeded draw), with the largest miss
/// printed. A seeded draw is scored on the CPU too: the session must draw
/// the very ids, which is what the GPU's comparison measures against.
pub fn check_same_tokens(
    model: &str,
    prompt: &[u32],
    got: &[u32],
    expected: &[u32],
    sampling: &SamplingParams,
    what: &str,
) -> Result<(), String> {
    let seeded = sampling.temperature > 0.0;
    if !on_gpu() || (got == expected && !seeded) {
        if got != expected {
            let at = got.iter().zip(expected).take_while(|(a, b)| a == b).count();
            return Err(format!(
                "{what}: first difference at token {at}\n  expected: {expected:?}\n  got:      {got:?}"
            ));
        }
        if seeded {
            let misses = misses(model, prompt, got, sampling);
            if misses.iter().any(|(_, miss)| *miss != 0.0) {
                return Err(format!("{what}: the session draws other ids: {misses:?}"));
            }
        }
        return Ok(());
    }
    near_ties(got, expected, near_tie(model), what, |ids| {
        misses(model, prompt, ids, sampling)
    })
}

/// The GPU's side of [`check_same_tokens`]: `got` and `expected` are as
/// long, and each id of both misses the session's choice by at most `near`,
/// by `misses` (each id's score, printed, and its miss).
pub fn near_ties(
    got: &[u32],
    expected: &[u32],
    near: f32,
    what: &str,
    mut misses: impl FnMut(&[u32]) -> Vec<(String, f32)>,
) -> Result<(), String> {
    if got.len() != expected.len() {
        return Err(format!(
            "{what}: {} ids against {}",
            got.len(),
            expected.len()
        ));
    }
    let part = got.iter().zip(expected).position(|(a, b)| a != b);
    for (name, ids) in [("got", got), ("expected", expected)] {
        let misses = misses(ids);
        let (at, (worst, miss)) = misses
            .iter()
            .enumerate()
            .max_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .expect("some ids");
        let part = part.map_or("the same ids".into(), |at| {
            format!("ids part at token {at}")
        });
        eprintln!(
            "{what}: {part}; {name}'s largest miss of the session's choice is {miss:.3e} \
             ({worst}; tolerance {near})"
        );
        if *miss > near {
            return Err(format!(
                "{what}: {name}'s token {at} is not a near tie of the session's choice: {worst}"
            ));
        }
    }
    Ok(())
}

/// For each of `ids` after `prompt`, scored by a fresh session: the score,
/// and how far it misses the session's choice (greedy: nats below the most
/// likely token; seeded: how far the draw fell outside the token's share,
/// as a share of the distribution).
fn misses(
    model: &str,
    prompt: &[u32],
    ids: &[u32],
    sampling: &SamplingParams,
) -> Vec<(String, f32)> {
    let mut session = Session::load(&fixtures().model(model)).unwrap();
    if sampling.temperature > 0.0 {
        let draws = session.score_draws(prompt, ids, sampling).unwrap();
        draws.iter().map(|d| (format!("{d:?}"), d.miss)).collect()
    } else {
        let scores = session.score(prompt, ids).unwrap();
        scores.iter().map(|s| (format!("{s:?}"), s.gap())).collect()
    }
}

/// [`check_same_tokens`] for greedy ids, as an assertion.
pub fn assert_same_greedy(model: &str, prompt: &[u32], got: &[u32], expected: &[u32], what: &str) {
    let greedy = SamplingParams::greedy();
    check_same_tokens(model, prompt, got, expected, &greedy, what)
        .unwrap_or_else(|e| panic!("{e}"));
}
