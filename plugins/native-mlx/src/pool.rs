//! The keys and values of every decoding sequence of the batching engine,
//! in one paged pool per layer, so that a decoding step writes the new
//! positions of all sequences with one op and reads each group of
//! sequences with one gather (see `Model::packed_logits`).
//!
//! Per-sequence caches cost ops per sequence: on a GPU a decoding step is
//! bound by the number of kernels, and at 64 streams the per-sequence cache
//! updates, slices and attentions were most of a step. Here a layer's pool
//! is one array of rows `(rows, kv_heads, head_dim)`; a sequence owns pages
//! of [`PAGE`] rows, listed in its [`Pages`], and position `p` of it lives at
//! row `pages[p / PAGE] * PAGE + p % PAGE`. Pages are reused as sequences
//! end, and the pool grows by doubling when none is free.
//!
//! Attention reads a sequence's positions padded to a multiple of
//! [`BUCKET`] and masked: sequences whose padded lengths agree attend in
//! one kernel, and a sequence computes the same shapes alone or batched.

use mlx_rs::ops::indexing::take_axis;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::transforms::eval;
use mlx_rs::Array;

use crate::cache::KvCache;
use crate::error::Result;

/// Rows per page of the pool.
pub(crate) const PAGE: i32 = 128;

/// Attention reads lengths rounded up to a multiple of this.
pub(crate) const BUCKET: i32 = 128;

/// The pages of one sequence and how many of its positions are filled.
#[derive(Debug, Default)]
pub(crate) struct Pages {
    pages: Vec<i32>,
    len: i32,
}

impl Pages {
    /// Positions filled.
    pub(crate) fn len(&self) -> i32 {
        self.len
    }

    /// The pool row of position `pos`.
    pub(crate) fn row(&self, pos: i32) -> i32 {
        self.pages[(pos / PAGE) as usize] * PAGE + pos % PAGE
    }

    /// The length attention reads once `len` positions are filled.
    pub(crate) fn padded(len: i32) -> i32 {
        (len + BUCKET - 1) / BUCKET * BUCKET
    }
}

/// The layers' pools of keys and values.
pub(crate) struct KvPool {
    /// Per layer, `(keys, values)` of shape `(rows, kv_heads, head_dim)`;
    /// empty until the first write tells their shape and type.
    layers: Vec<(Array, Array)>,
    /// Pages handed out or free: the arrays are grown to this before use.
    pages: i32,
    free: Vec<i32>,
}

impl KvPool {
    /// An empty pool; it allocates on first use.
    pub(crate) fn new() -> Self {
        Self {
            layers: Vec::new(),
            pages: 0,
            free: Vec::new(),
        }
    }

    /// Whether no array is allocated.
    pub(crate) fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Frees every array (all sequences must have released their pages).
    pub(crate) fn clear(&mut self) {
        *self = Self::new();
    }

    /// Makes room in `seq` for positions up to `len`.
    pub(crate) fn reserve(&mut self, seq: &mut Pages, len: i32) {
        while (seq.pages.len() as i32) * PAGE < len {
            let page = match self.free.pop() {
                Some(page) => page,
                None => {
                    // Double, handing out the first new page now.
                    let grow = self.pages.max(1);
                    self.free.extend((self.pages + 1..self.pages + grow).rev());
                    self.pages += grow;
                    self.pages - grow
                }
            };
            seq.pages.push(page);
        }
    }

    /// Marks `len` positions of `seq` filled (after [`KvPool::reserve`]).
    pub(crate) fn fill(seq: &mut Pages, len: i32) {
        debug_assert!(len <= seq.pages.len() as i32 * PAGE);
        seq.len = len;
    }

    /// Gives the pages of `seq` back.
    pub(crate) fn release(&mut self, seq: Pages) {
        self.free.extend(seq.pages);
    }

    /// Grows the arrays to the pages handed out, allocating them with the
    /// shape and type of `like` (`(n, kv_heads, head_dim)` keys and values)
    /// on first use.
    fn ensure(&mut self, layers: usize, like: (&Array, &Array)) -> Result<()> {
        let rows = self.pages * PAGE;
        let fresh = |n: i32, a: &Array| zeros_dtype(&[n, a.dim(1), a.dim(2)], a.dtype());
        if self.layers.is_empty() {
            self.layers = (0..layers)
                .map(|_| Ok((fresh(rows, like.0)?, fresh(rows, like.1)?)))
                .collect::<Result<_>>()?;
            return Ok(());
        }
        let have = self.layers[0].0.dim(0);
        if have < rows {
            for (k, v) in &mut self.layers {
                *k = concatenate(&[k.clone(), fresh(rows - have, k)?], 0)?;
                *v = concatenate(&[v.clone(), fresh(rows - have, v)?], 0)?;
            }
            // Evaluated now: a pending concatenation would hold the old
            // buffers and make every later write copy the pool.
            eval(self.layers.iter().flat_map(|(k, v)| [k, v]))?;
        }
        Ok(())
    }

    /// Writes keys and values `(n, kv_heads, head_dim)` of `layer` (of
    /// `layers`) at pool rows `rows` (`(n,)`, int32) and returns the
    /// layer's pool after the write.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        layers: usize,
        rows: &Array,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array)> {
        self.ensure(layers, (keys, values))?;
        let at = rows.reshape(&[-1, 1, 1])?;
        let (k, v) = &mut self.layers[layer];
        *k = k.put_along_axis(&at, keys, 0)?;
        *v = v.put_along_axis(&at, values, 0)?;
        Ok((k.clone(), v.clone()))
    }

    /// Moves a prefilled sequence's per-layer caches (`(1, kv_heads, len,
    /// head_dim)`) into `seq`'s pages; `seq` must hold no position yet.
    pub(crate) fn adopt(&mut self, seq: &mut Pages, caches: &[KvCache]) -> Result<()> {
        let len = caches.first().map_or(0, KvCache::offset);
        self.reserve(seq, len);
        Self::fill(seq, len);
        if len == 0 {
            return Ok(());
        }
        let rows: Vec<i32> = (0..len).map(|p| seq.row(p)).collect();
        let rows = Array::from_slice(&rows, &[len]);
        for (layer, cache) in caches.iter().enumerate() {
            let (k, v) = cache.valid()?.expect("a filled cache");
            // `(1, heads, len, dim)` to rows `(len, heads, dim)`.
            let k = k.squeeze_axes(&[0])?.transpose_axes(&[1, 0, 2])?;
            let v = v.squeeze_axes(&[0])?.transpose_axes(&[1, 0, 2])?;
            self.write(layer, caches.len(), &rows, &k, &v)?;
        }
        Ok(())
    }

    /// Rows `index` (`(g, padded)`) of `layer`'s keys and values `(k, v)`
    /// (pools as [`KvPool::write`] returned them), as `(g, kv_heads,
    /// padded, head_dim)`.
    pub(crate) fn gather(pool: &(Array, Array), index: &Array) -> Result<(Array, Array)> {
        let read = |a: &Array| -> Result<Array> {
            Ok(take_axis(a, index, 0)?.transpose_axes(&[0, 2, 1, 3])?)
        };
        Ok((read(&pool.0)?, read(&pool.1)?))
    }

    /// Type of the stored keys, once allocated.
    #[cfg(test)]
    pub(crate) fn dtype(&self) -> Option<mlx_rs::Dtype> {
        self.layers.first().map(|(k, _)| k.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_reused_and_the_pool_doubles() {
        let mut pool = KvPool::new();
        let (mut a, mut b) = (Pages::default(), Pages::default());
        pool.reserve(&mut a, 1);
        pool.reserve(&mut b, PAGE + 1);
        assert_eq!(pool.pages, 4);
        assert_eq!(a.row(5), 5);
        assert_eq!(b.row(0), PAGE);
        assert_eq!(b.row(PAGE + 3), 2 * PAGE + 3);
        pool.release(a);
        let mut c = Pages::default();
        pool.reserve(&mut c, 1);
        assert_eq!(c.row(0), 0, "a released page is handed out again");
        assert_eq!(Pages::padded(1), BUCKET);
        assert_eq!(Pages::padded(BUCKET + 1), 2 * BUCKET);
    }

    #[test]
    fn writes_land_at_their_rows_and_gathers_read_them() {
        let mut pool = KvPool::new();
        let mut seq = Pages::default();
        pool.reserve(&mut seq, 3);
        let kv = |x: f32| Array::from_slice(&[x, x + 1.0], &[1, 1, 2]);
        for pos in 0..3 {
            let rows = Array::from_slice(&[seq.row(pos)], &[1]);
            pool.write(0, 1, &rows, &kv(pos as f32 * 10.0), &kv(-1.0))
                .unwrap();
        }
        assert_eq!(pool.dtype(), Some(mlx_rs::Dtype::Float32));
        let index = Array::from_slice(&[seq.row(2), seq.row(0)], &[1, 2]);
        let (k, _) = KvPool::gather(&pool.layers[0], &index).unwrap();
        assert_eq!(k.shape(), &[1, 1, 2, 2]);
        k.eval().unwrap();
        assert_eq!(k.as_slice::<f32>(), &[20.0, 21.0, 0.0, 1.0]);
    }
}
