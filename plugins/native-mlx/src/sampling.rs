//! Token sampling on the device: greedy, or temperature with top-k, top-p and min-p filters.
//!
//! The filters and their order are mlx-lm's (`make_sampler`): top-p, then
//! min-p, then top-k, then a categorical draw at the temperature. Each draw
//! takes a fresh key split from a seeded key, as `mx.random.seed` does, so a
//! seed gives the same tokens on every run (and the same as mlx-lm's).

use mlx_rs::ops::indexing::{argmax_axis, take_along_axis};
use mlx_rs::ops::{argpartition_axis, cumsum, select, sort_axis};
use mlx_rs::random::{categorical, key, split, uniform};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};
use crate::indexing::IndexOnStream;

/// How to choose each next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); higher spreads the choice.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches this mass;
    /// 0 or 1 turns it off.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one; 0 turns it off.
    pub min_p: f32,
    /// Seed of the random draws; `None` takes a new one per request.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_p: 0.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidRequest(what));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

/// Chooses tokens from log-probabilities for one request.
pub(crate) struct Sampler {
    params: SamplingParams,
    /// The key the next draw splits; `None` for greedy decoding.
    key: Option<Array>,
}

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let key = if params.temperature > 0.0 {
            Some(key(params.seed.unwrap_or_else(fresh_seed))?)
        } else {
            None
        };
        Ok(Self { params, key })
    }

    /// Whether this sampler always takes the most likely token.
    pub(crate) fn is_greedy(&self) -> bool {
        self.key.is_none()
    }

    /// Picks one token from `logprobs` of shape `(1, vocab)`; returns a lazy
    /// `uint32` array of shape `(1,)`.
    pub(crate) fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        let Some(draw) = self.next_draw_key()? else {
            return Ok(argmax_axis(logprobs, -1, None)?);
        };
        Ok(categorical(&self.scaled(logprobs)?, None, None, &draw)?)
    }

    /// Where this step's draw falls among the tokens of `logprobs` (shape
    /// `(1, vocab)`), computed as `categorical` draws from one row (MLX's
    /// inverse CDF: a uniform point times the total of the weights
    /// `exp(x - max)` of the scaled scores, placed among their running
    /// sums); advances the key as [`Sampler::sample`] does. `None` when
    /// greedy.
    pub(crate) fn draw(&mut self, logprobs: &Array) -> Result<Option<Draw>> {
        let Some(key) = self.next_draw_key()? else {
            return Ok(None);
        };
        let x = self
            .scaled(logprobs)?
            .reshape(&[-1])?
            .as_dtype(Dtype::Float32)?;
        let top = x.max(None)?;
        let weights = select(
            top.is_inf()?,
            x.eq(&top)?.as_dtype(Dtype::Float32)?,
            x.subtract(&top)?.exp()?,
        )?;
        let before = cumsum(&weights, 0, false, false)?;
        let total = weights.sum(None)?;
        let point = uniform::<_, f32>(0.0, 1.0, &[1][..], &key)?.multiply(&total)?;
        eval([&before, &total, &point])?;
        Ok(Some(Draw {
            before: before.as_slice::<f32>().to_vec(),
            total: total.as_slice::<f32>()[0],
            point: point.as_slice::<f32>()[0],
        }))
    }

    /// The probabilities a draw picks from, row by row, for logprobs of
    /// shape `(.., vocab)` (after the filters and the temperature). Lazy.
    pub(crate) fn probabilities(&self, logprobs: &Array) -> Result<Array> {
        let x = self.scaled(logprobs)?.as_dtype(Dtype::Float32)?;
        Ok(mlx_rs::ops::softmax_axis(&x, -1, None)?)
    }

    /// `n` uniform draws in `[0, 1)` from this step's key (advanced as a
    /// draw advances it). Lazy; `None` when greedy.
    pub(crate) fn uniforms(&mut self, n: usize) -> Result<Option<Array>> {
        let Some(key) = self.next_draw_key()? else {
            return Ok(None);
        };
        Ok(Some(uniform::<_, f32>(0.0, 1.0, &[n as i32][..], &key)?))
    }

    /// The key of this step's draw, the next one kept; `None` when greedy.
    fn next_draw_key(&mut self) -> Result<Option<Array>> {
        let Some(state) = self.key.take() else {
            return Ok(None);
        };
        let (next, draw) = split(&state, 2)?;
        self.key = Some(next);
        Ok(Some(draw))
    }

    /// `logprobs` filtered and at the temperature: what a draw picks from.
    fn scaled(&self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        let mut x = logprobs.clone();
        if 0.0 < p.top_p && p.top_p < 1.0 {
            x = apply_top_p(&x, p.top_p)?;
        }
        if p.min_p != 0.0 {
            x = apply_min_p(&x, p.min_p)?;
        }
        let vocab = usize::try_from(x.dim(-1)).unwrap_or(0);
        if 0 < p.top_k && p.top_k < vocab {
            x = apply_top_k(&x, p.top_k as i32)?;
        }
        Ok(x.multiply(Array::from_f32(1.0 / p.temperature))?)
    }
}

/// One seeded draw laid out on the host: each token holds the share
/// `[before[t], before[t + 1])` of the weights, and the draw takes the
/// token whose share holds `point`.
#[derive(Debug, Clone)]
pub(crate) struct Draw {
    before: Vec<f32>,
    total: f32,
    point: f32,
}

impl Draw {
    /// The token the draw takes: the last whose running sum before it is
    /// at most the point (`searchsorted(.., "right") - 1`, as MLX).
    pub(crate) fn choice(&self) -> u32 {
        let after = self.before.partition_point(|&b| b <= self.point);
        after.saturating_sub(1) as u32
    }

    /// How far the point lies outside `token`'s share, as a fraction of the
    /// total weight: 0 for the choice. `None` outside the vocabulary.
    pub(crate) fn miss(&self, token: u32) -> Option<f32> {
        let t = token as usize;
        let low = *self.before.get(t)?;
        let high = self.before.get(t + 1).copied().unwrap_or(self.total);
        let outside = if self.point < low {
            low - self.point
        } else if self.point >= high && t + 1 < self.before.len() {
            self.point - high
        } else {
            0.0
        };
        Some(outside / self.total)
    }
}

/// A seed for requests that do not bring one.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS once per process and perturbed per
    // instance, which is all the entropy a sampling seed needs.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

fn neg_inf(like: &Array) -> Array {
    Array::from_f32(f32::NEG_INFINITY)
        .as_dtype(like.dtype())
        .unwrap_or_else(|_| Array::from_f32(f32::NEG_INFINITY))
}

/// Masks every token outside the `k` most likely with `-inf`.
pub(crate) fn apply_top_k(logprobs: &Array, k: i32) -> Result<Array> {
    let order = argpartition_axis(&logprobs.negative()?, k - 1, -1)?;
    let dropped = order.at((.., k..))?;
    Ok(logprobs.put_along_axis(&dropped, neg_inf(logprobs), -1)?)
}

/// Masks the least likely tokens that together hold less than `1 - top_p` of the mass.
pub(crate) fn apply_top_p(logprobs: &Array, top_p: f32) -> Result<Array> {
    let sorted = sort_axis(logprobs, -1)?;
    let probs = sorted.as_dtype(Dtype::Float32)?.exp()?;
    let mass_above = cumsum(&probs, -1, true, false)?;
    let total = mass_above.at((.., ..1))?.add(probs.at((.., ..1))?)?;
    let dropped = mass_above
        .ge(total.multiply(Array::from_f32(top_p))?)?
        .sum_axis(-1, true)?;
    let threshold = take_along_axis(&sorted, &dropped, -1)?;
    Ok(select(
        logprobs.lt(&threshold)?,
        neg_inf(logprobs),
        logprobs,
    )?)
}

/// Masks tokens less likely than `min_p` times the most likely one.
pub(crate) fn apply_min_p(logprobs: &Array, min_p: f32) -> Result<Array> {
    let top = logprobs.max_axis(-1, true)?;
    let floor = top.add(Array::from_f32(min_p.ln()))?;
    Ok(select(logprobs.lt(&floor)?, neg_inf(logprobs), logprobs)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log-probabilities of `probs` as a `(1, n)` array.
    fn logprobs(probs: &[f32]) -> Array {
        let logs: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        Array::from_slice(&logs, &[1, probs.len() as i32])
    }

    /// Which entries survive a mask.
    fn kept(masked: Array) -> Vec<bool> {
        masked.eval().unwrap();
        masked
            .as_slice::<f32>()
            .iter()
            .map(|v| v.is_finite())
            .collect()
    }

    const PROBS: [f32; 5] = [0.05, 0.4, 0.1, 0.3, 0.15];

    #[test]
    fn top_k_keeps_the_k_most_likely() {
        let got = kept(apply_top_k(&logprobs(&PROBS), 2).unwrap());
        assert_eq!(got, [false, true, false, true, false]);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // 0.4 + 0.3 = 0.7 < 0.75, so 0.15 is needed too.
        let got = kept(apply_top_p(&logprobs(&PROBS), 0.75).unwrap());
        assert_eq!(got, [false, true, false, true, true]);
        let got = kept(apply_top_p(&logprobs(&PROBS), 0.7).unwrap());
        assert_eq!(got, [false, true, false, true, false]);
    }

    #[test]
    fn min_p_is_relative_to_the_most_likely() {
        // Threshold 0.4 * 0.3 = 0.12.
        let got = kept(apply_min_p(&logprobs(&PROBS), 0.3).unwrap());
        assert_eq!(got, [false, true, false, true, true]);
    }

    fn draw(params: SamplingParams, n: usize) -> Vec<u32> {
        let mut sampler = Sampler::new(params).unwrap();
        let x = logprobs(&PROBS);
        (0..n)
            .map(|_| {
                let t = sampler.sample(&x).unwrap();
                t.eval().unwrap();
                t.as_slice::<u32>()[0]
            })
            .collect()
    }

    #[test]
    fn greedy_takes_the_argmax() {
        assert_eq!(draw(SamplingParams::greedy(), 3), [1, 1, 1]);
    }

    #[test]
    fn a_seed_repeats_and_filters_hold() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            seed: Some(7),
            ..SamplingParams::greedy()
        };
        let first = draw(params.clone(), 32);
        assert_eq!(first, draw(params.clone(), 32));
        assert!(first.iter().all(|t| *t == 1 || *t == 3), "{first:?}");
        assert!(first.contains(&1) && first.contains(&3), "{first:?}");
        let other = draw(
            SamplingParams {
                seed: Some(8),
                ..params
            },
            32,
        );
        assert_ne!(first, other);
    }

    #[test]
    fn invalid_values_are_refused() {
        let bad = SamplingParams {
            top_p: 1.5,
            ..SamplingParams::greedy()
        };
        assert_eq!(
            Sampler::new(bad).err().unwrap().to_string(),
            "invalid request: top_p must be in [0, 1], got 1.5"
        );
    }
}
