//! SpecPrefill: a long prompt prefilled in part. A scorer (the drafter:
//! a small model of the same tokenizer, or the model's own first layers)
//! reads the whole prompt and says how much attention its last tokens give
//! each earlier one; the target then prefills only the spans that matter
//! most, with the prompt's head and tail always among them, each token at
//! its own position (RoPE positions stay the prompt's, so the cache holds
//! fewer positions than the prompt has). Decoding goes on from the
//! prompt's end.
//!
//! It trades answer quality for time to first token: the target never
//! sees what was dropped. Experimental, off by default (setting
//! `spec_prefill`); see the plugin's README for when it helps.

use std::ops::Range;

/// When and how much of a prompt is prefilled (the `spec_prefill_*`
/// settings).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecPrefill {
    /// Prompts with fewer tokens to compute (cached prefixes excluded) are
    /// prefilled whole.
    pub min_tokens: usize,
    /// The share of those tokens prefilled, in (0, 1].
    pub keep: f32,
    /// Queries at the prompt's end whose attention scores the rest.
    pub lookahead: usize,
}

impl Default for SpecPrefill {
    fn default() -> Self {
        Self {
            min_tokens: 2048,
            keep: 0.3,
            lookahead: 8,
        }
    }
}

/// Tokens are kept or dropped in spans of this many, aligned at multiples
/// of it from the prompt's start (the prefix cache's blocks).
pub const SPAN: usize = crate::prefix::BLOCK;

/// The prompt positions to prefill, in order: all of `0..cached` (already
/// in the cache), the first span after them and the last two spans of
/// `scores.len()` (the head and the tail, where instructions and the
/// question sit), then the other spans by their mean score, highest first,
/// until `keep` of the uncached positions are in.
pub fn select(scores: &[f32], cached: usize, keep: f32) -> Vec<usize> {
    let n = scores.len();
    // Spans end at multiples of SPAN; the first may be short.
    let mut spans: Vec<Range<usize>> = Vec::new();
    let mut start = cached;
    while start < n {
        let end = ((start / SPAN + 1) * SPAN).min(n);
        spans.push(start..end);
        start = end;
    }
    let budget = ((n - cached) as f32 * keep.clamp(0.0, 1.0)).ceil() as usize;
    let mut chosen = vec![false; spans.len()];
    let mut taken = 0;
    let fixed = [
        0,
        spans.len().saturating_sub(2),
        spans.len().saturating_sub(1),
    ];
    for &i in fixed.iter().filter(|&&i| i < spans.len()) {
        if !chosen[i] {
            chosen[i] = true;
            taken += spans[i].len();
        }
    }
    let mean = |s: &Range<usize>| scores[s.clone()].iter().sum::<f32>() / s.len() as f32;
    let mut ranked: Vec<usize> = (0..spans.len()).filter(|&i| !chosen[i]).collect();
    ranked.sort_by(|&a, &b| mean(&spans[b]).total_cmp(&mean(&spans[a])).then(a.cmp(&b)));
    for i in ranked {
        if taken >= budget {
            break;
        }
        chosen[i] = true;
        taken += spans[i].len();
    }
    (0..cached)
        .chain(
            spans
                .iter()
                .zip(&chosen)
                .filter(|(_, &c)| c)
                .flat_map(|(s, _)| s.clone()),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_head_the_tail_and_the_spans_that_matter() {
        // Ten spans; span 4 matters most, then span 6.
        let n = 10 * SPAN;
        let mut scores = vec![0.0f32; n];
        scores[4 * SPAN + 3] = 5.0;
        scores[6 * SPAN..7 * SPAN]
            .iter_mut()
            .for_each(|s| *s = 0.01);
        let kept = select(&scores, 0, 0.5);
        let spans: Vec<usize> = kept.chunks(SPAN).map(|c| c[0] / SPAN).collect();
        assert_eq!(spans, [0, 4, 6, 8, 9]);
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        // At least what was asked for, in whole spans.
        assert_eq!(select(&scores, 0, 0.31).len(), 4 * SPAN);
        assert_eq!(select(&scores, 0, 1.0).len(), n);
    }

    #[test]
    fn a_cached_prefix_is_kept_and_not_counted() {
        let n = 8 * SPAN + 5;
        let scores: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let cached = 2 * SPAN + 7;
        let kept = select(&scores, cached, 0.0);
        // The cache, the rest of its span (the head), and the last two
        // spans (the final one short).
        let expected: Vec<usize> = (0..3 * SPAN).chain(7 * SPAN..n).collect();
        assert_eq!(kept, expected);
        // The prompt's last position is always prefilled or fed.
        assert_eq!(*kept.last().unwrap(), n - 1);
    }

    #[test]
    fn a_short_prompt_is_kept_whole() {
        let scores = vec![1.0f32; SPAN + 3];
        assert_eq!(select(&scores, 0, 0.1), (0..SPAN + 3).collect::<Vec<_>>());
    }
}
