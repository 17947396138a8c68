//! Sliding-window attention masks (gpt-oss's `sliding_attention` layers), over keys kept in position order.
//!
//! Every key stays in the cache or the pool, position `p` at index `p`, and
//! a sliding layer hides what lies outside its window with a mask, as
//! mlx-lm's `create_causal_mask(N, offset, window_size)` does: a query at
//! position `q` sees keys `q - window < k <= q`. (mlx-lm's `generate_step`
//! keeps a sliding layer's keys in a rotating buffer instead; the same keys
//! in another order.) The same rule serves a session, a batch's decoding
//! rows and its prompt chunks, and a speculative verification, so their
//! numbers agree with one another.

use mlx_rs::ops::{arange, broadcast_to};
use mlx_rs::Array;

use crate::error::Result;

/// Whether `len` queries from position `offset` over `offset + len` keys
/// need a window mask (some key lies outside some query's window).
pub(super) fn needed(len: i32, offset: i32, window: i32) -> bool {
    offset + len > window
}

/// The causal window mask of `len` queries from position `offset` over
/// keys `0..offset + len`: `(len, offset + len)` bool, mlx-lm's
/// `create_causal_mask` with `window_size`.
pub(super) fn causal(len: i32, offset: i32, window: i32) -> Result<Array> {
    let keys = arange::<_, i32>(0, offset + len, 1)?.reshape(&[1, -1])?;
    let queries = arange::<_, i32>(offset, offset + len, 1)?.reshape(&[-1, 1])?;
    Ok(queries
        .ge(&keys)?
        .logical_and(queries.lt(keys.add(Array::from_int(window))?)?)?)
}

/// The window of decoding rows at `positions` (`(rows,)` int32, one query
/// each) over `padded` keys from position 0, laid out as the pool's gather
/// lays out its rows: `(kv_heads * rows, 1, 1, padded)` bool, head `h` of
/// row `i` at `h * rows + i`. Positions past a row's own are left to the
/// row's causal mask.
pub(super) fn decoding(
    positions: &Array,
    padded: i32,
    window: i32,
    kv_heads: i32,
) -> Result<Array> {
    let rows = positions.dim(0);
    let keys = arange::<_, i32>(0, padded, 1)?.reshape(&[1, padded])?;
    let inside = positions
        .reshape(&[rows, 1])?
        .lt(keys.add(Array::from_int(window))?)?;
    Ok(broadcast_to(
        inside.reshape(&[1, rows, padded])?,
        &[kv_heads, rows, padded],
    )?
    .reshape(&[kv_heads * rows, 1, 1, padded])?)
}
