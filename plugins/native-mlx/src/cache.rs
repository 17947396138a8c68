//! The key/value cache of one attention layer, grown in steps like mlx-lm's `KVCache`.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::Ellipsis;
use mlx_rs::ops::zeros_dtype;
use mlx_rs::Array;

use crate::error::Result;
use crate::ffi::slice_update;
use crate::indexing::IndexOnStream;

/// Positions are allocated this many at a time: growing by one position per
/// token would copy the whole cache every step, and allocating the maximum
/// context up front would waste memory on short conversations.
const STEP: i32 = 256;

/// Keys and values of shape `(batch, kv_heads, capacity, head_dim)`; the
/// first `offset` positions are valid.
#[derive(Default)]
pub(crate) struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    /// The position of its first entry: 0, but for an MTP layer's cache
    /// that begins where this request's hidden states of the model begin
    /// (after a cached prefix). RoPE rotates by the position.
    start: i32,
    /// Where the last prompt's prefill ended: sliding-window layers order a
    /// decoding query's window from it (see `model::window`).
    prefilled: i32,
    /// While a prompt is scored (SpecPrefill): how much attention its last
    /// queries give each position, summed over this layer's heads.
    pub(crate) importance: Option<Importance>,
}

/// The attention the last `last` queries of a forward pass give every
/// cached position, summed over heads and queries (`(positions,)`
/// float32), accumulated by the layer's attention.
pub(crate) struct Importance {
    pub(crate) last: i32,
    pub(crate) sum: Option<Array>,
}

impl KvCache {
    /// A cache holding `keys` and `values` (`(batch, kv_heads, len,
    /// head_dim)`), all valid: a prefix restored from the prefix cache.
    pub(crate) fn from_state(keys: Array, values: Array) -> Self {
        let offset = keys.dim(2);
        Self {
            keys: Some(keys),
            values: Some(values),
            offset,
            start: 0,
            prefilled: offset,
            importance: None,
        }
    }

    /// An empty cache whose first entry will be at position `start`.
    pub(crate) fn starting_at(start: i32) -> Self {
        Self {
            start,
            ..Self::default()
        }
    }

    /// The position of its first entry.
    pub(crate) fn start(&self) -> i32 {
        self.start
    }

    /// The position the next entry takes.
    pub(crate) fn position(&self) -> i32 {
        self.start + self.offset
    }

    /// Records that a prompt's prefill ended at position `len`.
    pub(crate) fn set_prefilled(&mut self, len: i32) {
        self.prefilled = len;
    }

    /// Where the last prompt's prefill ended.
    pub(crate) fn prefilled(&self) -> i32 {
        self.prefilled
    }

    /// The valid keys and values (views of the cache); `None` when empty.
    pub(crate) fn valid(&self) -> Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => Ok(Some((
                k.at((Ellipsis, ..self.offset, ..))?,
                v.at((Ellipsis, ..self.offset, ..))?,
            ))),
            _ => Ok(None),
        }
    }

    /// Number of valid positions.
    pub(crate) fn offset(&self) -> i32 {
        self.offset
    }

    /// Appends `keys`/`values` (`(batch, kv_heads, new, head_dim)`) and returns
    /// all valid keys and values.
    pub(crate) fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array)> {
        let prev = self.offset;
        let new = keys.dim(2);
        let capacity = self.keys.as_ref().map_or(0, |k| k.dim(2));
        if prev + new > capacity {
            let shape = keys.shape();
            let (batch, heads, k_dim, v_dim) = (shape[0], shape[1], shape[3], values.dim(3));
            let steps = (STEP + new - 1) / STEP;
            let grow_k = zeros_dtype(&[batch, heads, steps * STEP, k_dim], keys.dtype())?;
            let grow_v = zeros_dtype(&[batch, heads, steps * STEP, v_dim], values.dtype())?;
            let (k, v) = match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    // After a trim the tail past `prev` is stale: drop it so
                    // the new block starts right after the valid positions.
                    if prev % STEP != 0 {
                        k = k.at((Ellipsis, ..prev, ..))?;
                        v = v.at((Ellipsis, ..prev, ..))?;
                    }
                    (concatenate(&[k, grow_k], 2)?, concatenate(&[v, grow_v], 2)?)
                }
                _ => (grow_k, grow_v),
            };
            self.keys = Some(k);
            self.values = Some(v);
        }
        self.offset += new;
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            unreachable!("allocated above");
        };
        let write = |cache: &mut Array, new: &Array| -> Result<()> {
            let mut stop = new.shape().to_vec();
            stop[2] = self.offset;
            let start = [0, 0, prev, 0];
            *cache = slice_update(cache, new, &start[..stop.len()], &stop)?;
            Ok(())
        };
        write(k, keys)?;
        write(v, values)?;
        if self.offset < k.dim(2) {
            Ok((
                k.at((Ellipsis, ..self.offset, ..))?,
                v.at((Ellipsis, ..self.offset, ..))?,
            ))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    /// Forgets every position from `len` on; the memory is reused.
    pub(crate) fn truncate(&mut self, len: i32) {
        self.offset = self.offset.min(len.max(0));
    }

    /// The arrays to evaluate so that the cache holds data, not a graph.
    pub(crate) fn state(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::arange;

    fn block(from: i32, n: i32) -> Array {
        arange::<_, f32>(from as f64, (from + n) as f64, None)
            .unwrap()
            .reshape(&[1, 1, n, 1])
            .unwrap()
    }

    fn flat(a: &Array) -> Vec<f32> {
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn grows_in_steps_and_keeps_order() {
        let mut cache = KvCache::default();
        let (k, _) = cache.update_and_fetch(&block(0, 3), &block(0, 3)).unwrap();
        assert_eq!(flat(&k), vec![0.0, 1.0, 2.0]);
        assert_eq!(cache.keys.as_ref().unwrap().dim(2), STEP);
        let (k, v) = cache
            .update_and_fetch(&block(3, STEP), &block(3, STEP))
            .unwrap();
        assert_eq!(k.dim(2), STEP + 3);
        // As in mlx-lm, the grown cache ends right after the new block.
        assert_eq!(cache.keys.as_ref().unwrap().dim(2), STEP + 3);
        assert_eq!(
            flat(&v),
            (0..STEP + 3).map(|i| i as f32).collect::<Vec<_>>()
        );
    }

    #[test]
    fn truncate_then_overwrite() {
        let mut cache = KvCache::default();
        cache.update_and_fetch(&block(0, 5), &block(0, 5)).unwrap();
        cache.truncate(2);
        assert_eq!(cache.offset(), 2);
        let (k, _) = cache
            .update_and_fetch(&block(10, 2), &block(10, 2))
            .unwrap();
        assert_eq!(flat(&k), vec![0.0, 1.0, 10.0, 11.0]);
    }
}
