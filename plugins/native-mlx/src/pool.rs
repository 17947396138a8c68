//! The keys and values of every decoding sequence of the batching engine,
//! in one paged pool per layer, so that a decoding step writes the new
//! positions of all sequences with one op and reads each group of
//! sequences with one gather (see `Model::packed_forward`).
//!
//! Per-sequence caches cost ops per sequence: on a GPU a decoding step is
//! bound by the number of kernels, and at 64 streams the per-sequence cache
//! updates, slices and attentions were most of a step. Here a layer's pool
//! is one array `(kv_heads, rows, head_dim)`; a sequence owns pages of
//! [`PAGE`] rows, listed in its [`Pages`], and position `p` of it lives at
//! row `pages[p / PAGE] * PAGE + p % PAGE`. Pages are reused as sequences
//! end, and the pool grows by doubling when none is free.
//!
//! Attention reads a sequence's positions padded to a multiple of
//! [`BUCKET`] and masked: sequences whose padded lengths agree attend in
//! one kernel, and a sequence computes the same shapes alone or batched.
//!
//! The gather is most of a decoding step's attention on a GPU, so it is
//! shaped for speed: heads first, so that the rows it reads come out as the
//! contiguous `(kv_heads * sequences, 1, padded, head_dim)` keys attention
//! takes, with no copy after it; and over the rows' bytes seen as 8-byte
//! words (MLX's gather moves one element per thread), which moves the same
//! bits in a quarter of the threads for 16-bit types.

use std::cell::OnceCell;

use mlx_rs::ops::{broadcast_to, concatenate, zeros_dtype};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

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

    /// The `i`th page held, 0 past the last (a page table's padding).
    pub(crate) fn page(&self, i: i32) -> i32 {
        self.pages.get(i as usize).copied().unwrap_or(0)
    }

    /// Pages held.
    pub(crate) fn held(&self) -> i32 {
        self.pages.len() as i32
    }

    /// Pages that hold `len` positions.
    pub(crate) fn needed(len: i32) -> i32 {
        (len + PAGE - 1) / PAGE
    }

    /// The length attention reads once `len` positions are filled.
    pub(crate) fn padded(len: i32) -> i32 {
        (len + BUCKET - 1) / BUCKET * BUCKET
    }
}

/// Pool rows that every layer of a step reads or writes, `(1, n, 1)` int32,
/// with the same rows broadcast to the shape a layer's gather or write
/// takes (`(kv_heads, n, words)`), made once a step. MLX's
/// `take_along_axis` and `put_along_axis` broadcast their index to that
/// shape themselves, an op per call; given it broadcast they add none, and
/// the kernels read the same index either way.
pub(crate) struct RowIndex {
    rows: Array,
    wide: OnceCell<Array>,
}

impl RowIndex {
    /// `rows`, `(1, n, 1)` int32.
    pub(crate) fn new(rows: Array) -> Self {
        Self {
            rows,
            wide: OnceCell::new(),
        }
    }

    /// The rows broadcast to `shape` (`(heads, n, width)`), made on first
    /// use and kept for the step; another shape (values wider than keys)
    /// gets its own broadcast, not kept.
    fn wide(&self, shape: &[i32]) -> Result<Array> {
        if let Some(wide) = self.wide.get() {
            if wide.shape() == shape {
                return Ok(wide.clone());
            }
            return Ok(broadcast_to(&self.rows, shape)?);
        }
        let wide = broadcast_to(&self.rows, shape)?;
        let _ = self.wide.set(wide.clone());
        Ok(wide)
    }
}

/// The layers' pools of keys and values.
pub(crate) struct KvPool {
    /// Per layer, `(keys, values)` of shape `(kv_heads, rows, head_dim)`;
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

    /// Makes sure `pages` more pages can be handed out with no further
    /// growth: the engine asks for a whole step's pages at once, so that the
    /// arrays grow (a copy of every layer's, and a wait for the device)
    /// once for many new sequences rather than once per doubling.
    pub(crate) fn make_room(&mut self, pages: i32) {
        let free = self.free.len() as i32;
        if free >= pages {
            return;
        }
        let mut total = self.pages.max(1);
        while total - self.pages + free < pages {
            total *= 2;
        }
        self.free.extend((self.pages..total).rev());
        self.pages = total;
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
    /// shape and type of `like` (`(kv_heads, n, head_dim)` keys and values)
    /// on first use.
    fn ensure(&mut self, layers: usize, like: (&Array, &Array)) -> Result<()> {
        let rows = self.pages * PAGE;
        let fresh = |n: i32, a: &Array| zeros_dtype(&[a.dim(0), n, a.dim(2)], a.dtype());
        if self.layers.is_empty() {
            self.layers = (0..layers)
                .map(|_| Ok((fresh(rows, like.0)?, fresh(rows, like.1)?)))
                .collect::<Result<_>>()?;
            return Ok(());
        }
        let have = self.layers[0].0.dim(1);
        if have < rows {
            for (k, v) in &mut self.layers {
                *k = concatenate(&[k.clone(), fresh(rows - have, k)?], 1)?;
                *v = concatenate(&[v.clone(), fresh(rows - have, v)?], 1)?;
            }
            // Evaluated now: a pending concatenation would hold the old
            // buffers and make every later write copy the pool.
            eval(self.layers.iter().flat_map(|(k, v)| [k, v]))?;
        }
        Ok(())
    }

    /// Writes keys and values `(kv_heads, n, head_dim)` of `layer` (of
    /// `layers`) at pool rows `rows` (`(1, n, 1)`) and returns the
    /// layer's pool after the write.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        layers: usize,
        rows: &RowIndex,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array)> {
        self.ensure(layers, (keys, values))?;
        let (k, v) = &mut self.layers[layer];
        *k = k.put_along_axis(&rows.wide(keys.shape())?, keys, 1)?;
        *v = v.put_along_axis(&rows.wide(values.shape())?, values, 1)?;
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
        let rows = RowIndex::new(Array::from_slice(&rows, &[1, len, 1]));
        for (layer, cache) in caches.iter().enumerate() {
            let (k, v) = cache.valid()?.expect("a filled cache");
            self.write(
                layer,
                caches.len(),
                &rows,
                &k.squeeze_axes(&[0])?,
                &v.squeeze_axes(&[0])?,
            )?;
        }
        Ok(())
    }

    /// Rows `index` (`(1, g * padded, 1)`, `g` sequences of `padded`
    /// positions) of `layer`'s keys and values `(k, v)` (pools as
    /// [`KvPool::write`] returned them), as `(kv_heads * g, 1, padded,
    /// head_dim)`, heads first: row `h * g + i` is head `h` of sequence `i`.
    /// A gather along the pool's rows (`take_along_axis`, whose output is
    /// laid out as its index: contiguous, unlike `take`'s).
    pub(crate) fn gather(
        pool: &(Array, Array),
        index: &RowIndex,
        padded: i32,
    ) -> Result<(Array, Array)> {
        let read = |a: &Array| -> Result<Array> {
            let dim = a.dim(2);
            let n = index.rows.dim(1);
            let rows = match word(a) {
                Some(word) => {
                    let words = a.view_dtype(word)?;
                    let wide = index.wide(&[words.dim(0), n, words.dim(2)])?;
                    words.take_along_axis(&wide, 1)?.view_dtype(a.dtype())?
                }
                None => a.take_along_axis(&index.wide(&[a.dim(0), n, dim])?, 1)?,
            };
            Ok(rows.reshape(&[-1, 1, padded, dim])?)
        };
        Ok((read(&pool.0)?, read(&pool.1)?))
    }

    /// Copies of the keys and values at pool rows `rows` in every layer,
    /// `(1, kv_heads, n, head_dim)` as a sequence's cache holds them (new
    /// buffers: the pool's next write can reuse its own).
    pub(crate) fn copy_rows(&self, rows: &[i32]) -> Result<Vec<(Array, Array)>> {
        let n = rows.len() as i32;
        let index = RowIndex::new(Array::from_slice(rows, &[1, n, 1]));
        self.layers
            .iter()
            .map(|pool| {
                let (k, v) = Self::gather(pool, &index, n)?;
                let cache = |a: Array| a.reshape(&[1, -1, n, a.dim(3)]);
                Ok((cache(k)?, cache(v)?))
            })
            .collect()
    }

    /// Every layer's keys and values (to evaluate a step's writes).
    pub(crate) fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers.iter().flat_map(|(k, v)| [k, v])
    }

    /// Type of the stored keys, once allocated.
    #[cfg(test)]
    pub(crate) fn dtype(&self) -> Option<mlx_rs::Dtype> {
        self.layers.first().map(|(k, _)| k.dtype())
    }
}

/// The widest word type whose size divides a row of `a` (`(.., .., head_dim)`),
/// to gather the row's bytes in (`None` when the type is that wide already).
fn word(a: &Array) -> Option<Dtype> {
    let bytes = a.dim(2) as usize * a.item_size();
    [(8, Dtype::Uint64), (4, Dtype::Uint32)]
        .into_iter()
        .find(|&(size, _)| bytes % size == 0 && a.item_size() < size)
        .map(|(_, word)| word)
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
        // Room for 5 more with one free: one doubling; for 30 more then
        // (5 free), three at once. Those pages come without growing again.
        pool.make_room(5);
        assert_eq!(pool.pages, 8);
        pool.make_room(30);
        assert_eq!(pool.pages, 64);
        let mut d = Pages::default();
        pool.reserve(&mut d, 30 * PAGE);
        assert_eq!((d.held(), pool.pages), (30, 64));
        assert_eq!(Pages::needed(PAGE + 1), 2);
        assert_eq!(Pages::padded(BUCKET + 1), 2 * BUCKET);
    }

    #[test]
    fn writes_land_at_their_rows_and_gathers_read_them() {
        // Two heads of width 2: float32 rows of 8 bytes are gathered as
        // one u64 word each, float16 rows of 4 bytes as one u32.
        for dtype in [Dtype::Float32, Dtype::Float16] {
            let mut pool = KvPool::new();
            let mut seq = Pages::default();
            pool.reserve(&mut seq, 3);
            // `(kv_heads, 1, head_dim)`: head h of position p holds
            // [10p + h, 10p + h + 0.5].
            let kv = |x: f32| {
                Array::from_slice(&[x, x + 0.5, x + 1.0, x + 1.5], &[2, 1, 2])
                    .as_dtype(dtype)
                    .unwrap()
            };
            for pos in 0..3 {
                let rows = RowIndex::new(Array::from_slice(&[seq.row(pos)], &[1, 1, 1]));
                pool.write(0, 1, &rows, &kv(pos as f32 * 10.0), &kv(-1.0))
                    .unwrap();
            }
            assert_eq!(pool.dtype(), Some(dtype));
            // One sequence of padded length 2 reading positions 2 and 0.
            let index = RowIndex::new(Array::from_slice(&[seq.row(2), seq.row(0)], &[1, 2, 1]));
            let (k, _) = KvPool::gather(&pool.layers[0], &index, 2).unwrap();
            assert_eq!(k.shape(), &[2, 1, 2, 2]);
            let k = k.as_dtype(Dtype::Float32).unwrap();
            k.eval().unwrap();
            assert_eq!(k.strides(), &[4, 4, 2, 1], "contiguous, no copy needed");
            k.eval().unwrap();
            assert_eq!(
                k.as_slice::<f32>(),
                &[20.0, 20.5, 0.0, 0.5, 21.0, 21.5, 1.0, 1.5],
                "{dtype:?}"
            );
        }
    }
}
