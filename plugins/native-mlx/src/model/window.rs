//! Sliding-window attention (Gemma 3's local layers): which positions a query sees, and in which order, so that the sums come out as mlx-lm's.
//!
//! Every position stays in the cache (memory is not freed at the window's
//! edge); a query simply attends to the last `window` positions, itself
//! included. Two details make the numbers mlx-lm's, bit for bit:
//!
//! - Several queries (a prompt chunk) attend under a boolean mask over all
//!   earlier positions. mlx-lm's `RotatingKVCache` keeps only the last
//!   `window - 1` of them before the chunk; positions that a mask hides add
//!   exact zeros, so the result is the same.
//! - One query (decoding) attends to its window without a mask, in the
//!   order of `RotatingKVCache`'s ring buffer, because attention sums over
//!   keys in the order they lie and a rotated order rounds differently.
//!   After a prompt prefilled up to position `base`, position `q` lies in
//!   slot `(q - base) mod window` when `base >= window` (the buffer is
//!   trimmed to the window at the first decoding step and written from
//!   slot 0), and in slot `q mod window` otherwise (the buffer grows to the
//!   window and wraps). Before the window fills, all positions lie in order.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::Ellipsis;
use mlx_rs::Array;

use crate::error::Result;
use crate::indexing::IndexOnStream;

/// Where the ring buffer's slot 0 lies among a window of `len` positions
/// ending at `len` (exclusive): the index into that window of its first
/// slot, for a sequence whose prompt was prefilled up to `base`.
fn first_slot(len: i32, base: i32, window: i32) -> i32 {
    let base = if base >= window { base } else { 0 };
    (base - len).rem_euclid(window)
}

/// The positions one decoding query at `len - 1` attends to, in the order
/// mlx-lm sums them (see the module's documentation).
pub(crate) fn decoding_positions(len: i32, base: i32, window: i32) -> Vec<i32> {
    if len <= window {
        return (0..len).collect();
    }
    let start = len - window;
    let first = first_slot(len, base, window);
    (start + first..len).chain(start..start + first).collect()
}

/// The keys or values `(batch, heads, len, dim)` of every position, cut to
/// what one decoding query at `len - 1` attends to, in mlx-lm's order.
pub(crate) fn decoding_view(all: &Array, base: i32, window: i32) -> Result<Array> {
    let len = all.dim(2);
    if len <= window {
        return Ok(all.clone());
    }
    let start = len - window;
    let first = first_slot(len, base, window);
    let last = all.at((Ellipsis, start + first.., ..))?;
    if first == 0 {
        return Ok(last);
    }
    let wrapped = all.at((Ellipsis, start..start + first, ..))?;
    Ok(concatenate(&[last, wrapped], 2)?)
}

/// The mask of `len` queries at positions `offset..offset + len` over keys
/// `0..offset + len`: each sees itself and the `window - 1` positions
/// before it (mlx-lm's `create_causal_mask` with a window), `(len, offset +
/// len)`. `None` where no query reaches past its window: the causal mask
/// alone, as mlx-lm then uses.
pub(crate) fn prefill_mask(offset: i32, len: i32, window: i32) -> Option<Array> {
    if offset + len <= window {
        return None;
    }
    let keys = offset + len;
    let mask: Vec<bool> = (offset..offset + len)
        .flat_map(|q| (0..keys).map(move |k| k <= q && q < k + window))
        .collect();
    Some(Array::from_slice(&mask, &[len, keys]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_order_follows_the_ring_buffer() {
        // A 12-token prompt, its last token fed by the first step: the
        // prompt's 11 positions fill the buffer, which is trimmed to the
        // last 8 and written from slot 0 on.
        assert_eq!(decoding_positions(12, 11, 8), [11, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(decoding_positions(13, 11, 8), [11, 12, 5, 6, 7, 8, 9, 10]);
        assert_eq!(
            decoding_positions(19, 11, 8),
            [11, 12, 13, 14, 15, 16, 17, 18]
        );
        // A short prompt: in order until the window fills, then it wraps
        // at slot 0.
        assert_eq!(decoding_positions(6, 4, 8), [0, 1, 2, 3, 4, 5]);
        assert_eq!(decoding_positions(9, 4, 8), [8, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn the_view_reads_the_positions_in_that_order() {
        let all = mlx_rs::ops::arange::<_, f32>(0.0, 13.0, None)
            .unwrap()
            .reshape(&[1, 1, 13, 1])
            .unwrap();
        let view = decoding_view(&all, 11, 8).unwrap();
        view.eval().unwrap();
        let expected: Vec<f32> = decoding_positions(13, 11, 8)
            .into_iter()
            .map(|p| p as f32)
            .collect();
        assert_eq!(view.as_slice::<f32>(), expected);
    }

    #[test]
    fn prefill_mask_is_the_window() {
        assert!(prefill_mask(0, 8, 8).is_none());
        let mask = prefill_mask(2, 3, 3).unwrap();
        mask.eval().unwrap();
        assert_eq!(mask.shape(), &[3, 5]);
        let rows: Vec<bool> = mask.as_slice::<bool>().to_vec();
        #[rustfmt::skip]
        let expected = [
            true, true, true, false, false,
            false, true, true, true, false,
            false, false, true, true, true,
        ];
        assert_eq!(rows, expected);
    }
}
