//! The decoder-only transformer of the supported families, built from a config and its weights.
//!
//! The graph is the one mlx-lm builds for `llama`, `qwen2`, `qwen3`, `phi3`,
//! `gemma3_text`, `qwen3_moe` and `gpt_oss` (op for op, including `addmm`
//! for biased projections, the fast RoPE, RMS norm and attention kernels,
//! and the routed experts of `moe`), which is what makes greedy outputs
//! bit-identical to mlx-lm's on the same MLX.

pub(crate) mod encoder;
mod gemma;
mod layers;
mod moe;
mod mtp;
pub(crate) mod vision;
mod weights;
pub(crate) mod window;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use mlx_rs::fast::{
    rms_norm, rope, rope_dynamic, scaled_dot_product_attention, ScaledDotProductAttentionMask,
};
use mlx_rs::nn::sigmoid;
use mlx_rs::ops::indexing::Ellipsis;
use mlx_rs::ops::{arange, clip, concatenate, minimum, select};
use mlx_rs::transforms::compile::compile;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Device, DeviceType, Stream};

use crate::cache::KvCache;
use crate::config::{Family, ModelConfig, RopeScaling, SlidingWindow};
use crate::error::Result;
use crate::indexing::IndexOnStream;
use crate::pool::{KvPool, RowIndex};
use layers::{Embedding, Layout, Linear, Parallel, Projections};
use moe::SparseMoe;
use weights::Weights;

/// How a model is placed on its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// On the CPU, large matrix products are split by output rows over this
    /// many threads (MLX computes each op on one thread). 1 turns splitting
    /// off. Default: the number of available cores. Ignored on a GPU.
    pub cpu_threads: usize,
    /// Smallest product, in multiply-adds (tokens times weights for a
    /// linear layer), that is split. Default 2^18: below it the extra ops
    /// cost more than the other cores gain.
    pub split_min_work: usize,
    /// Compute the query, key and value projections as one product, and the
    /// gate and up projections as another (see `Projections`): fewer,
    /// larger kernels. `None` (default): on a GPU, where a decoding step is
    /// bound by the number of kernels, but not on the CPU, where the layers
    /// stay exactly mlx-lm's.
    pub fuse_projections: Option<bool>,
    /// On a GPU, compute quantized products of a few rows (decoding) with
    /// Hangar's own CUDA kernel (`src/qmv.rs`) instead of MLX's `qmv`.
    /// Off by default until a GPU run shows it faster; ignored on the CPU.
    pub custom_qmv: bool,
    /// On a GPU, compute 4-bit mixture-of-experts products over rows sorted
    /// by expert, at two or more rows per expert, with Hangar's own CUDA
    /// kernel (`crate::qmv::gather_qmv`), which reads each expert's weights
    /// once for up to 4 of its rows, instead of MLX's `gather_qmm`, which
    /// reads them again for every row. On by default: Qwen3-30B-A3B 4-bit
    /// at 64 streams decodes 1.49x faster with it on an H100 (README);
    /// ignored on the CPU and on Metal.
    pub custom_gather_qmv: bool,
    /// Add a dense product's bias, and the residual after the attention's
    /// and the MLP's output projections, where it costs the host least to
    /// encode on a GPU: after a one-row product (MLX's `gemv`, a kernel,
    /// where a biased product is a captured cuBLAS graph), inside a product
    /// of more rows (cuBLAS, whose `C` adds it; an Add kernel fewer). Off:
    /// `nn.Linear`'s way, a bias inside, a residual after, which rounds as
    /// mlx-lm does (the CPU's exact parity); on, the sums round otherwise.
    /// `None` (default): on a GPU, where a decoding step is bound by what
    /// the host encodes (0.5B bfloat16 on an H100: 1.19x single-stream
    /// decode, README), off on the CPU.
    pub sums_by_rows: Option<bool>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            split_min_work: 1 << 18,
            fuse_projections: None,
            custom_qmv: false,
            custom_gather_qmv: true,
            sums_by_rows: None,
        }
    }
}

/// Rotary position embedding, as mlx-lm's `initialize_rope` configures it.
#[derive(Clone)]
struct Rope {
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    /// Precomputed frequencies (Llama 3 and Su scaling) instead of `base`.
    freqs: Option<Array>,
    /// Su scaling's factor of the rotated dimensions, applied before RoPE.
    input_scale: Option<f32>,
}

impl Rope {
    /// The model's RoPE (of its global layers, where some slide).
    fn new(config: &ModelConfig) -> Result<Self> {
        Self::with(config, config.rope_theta, &config.rope_scaling)
    }

    /// The RoPE of sliding-window layers: their own base, never scaled.
    /// `None` where they rotate as the model's (gpt-oss).
    fn local(config: &ModelConfig, window: &SlidingWindow) -> Result<Option<Self>> {
        window
            .rope_theta
            .map(|base| Self::with(config, base, &RopeScaling::None))
            .transpose()
    }

    fn with(config: &ModelConfig, base: f32, scaling: &RopeScaling) -> Result<Self> {
        let mut rope = Self {
            dims: config.rope_dims,
            traditional: config.rope_traditional,
            base: Some(base),
            scale: 1.0,
            freqs: None,
            input_scale: None,
        };
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => rope.scale = 1.0 / factor,
            RopeScaling::SuScaled {
                ref long_factor,
                scale,
            } => {
                rope.base = None;
                // mlx-lm's `SuScaledRoPE` is never traditional.
                rope.traditional = false;
                rope.freqs = Some(su_freqs(config.rope_dims, base, long_factor)?);
                rope.input_scale = (scale != 1.0).then_some(scale);
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            } => {
                let (freqs, scale) = yarn_freqs(
                    config.rope_dims,
                    base,
                    factor,
                    original_max_position_embeddings,
                    (beta_fast, beta_slow),
                    (mscale, mscale_all_dim),
                )?;
                rope.base = None;
                rope.freqs = Some(freqs);
                // YaRN's `mscale` scales the rotated part first, as Su's does.
                rope.input_scale = (scale != 1.0).then_some(scale);
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_context,
            } => {
                rope.base = None;
                rope.freqs = Some(llama3_freqs(
                    config.rope_dims,
                    base,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    old_context,
                )?);
            }
        }
        Ok(rope)
    }

    /// Su scaling's `x.at[..., :dims].multiply(scale)`: the rotated part of
    /// `x` scaled, in `x`'s type, the rest as it is.
    fn scaled_input(&self, x: &Array) -> Result<Option<Array>> {
        let Some(scale) = self.input_scale else {
            return Ok(None);
        };
        let scale = Array::from_f32(scale).as_dtype(x.dtype())?;
        Ok(Some(if self.dims == x.dim(-1) {
            x.multiply(&scale)?
        } else {
            let rotated = x.at((Ellipsis, ..self.dims))?.multiply(&scale)?;
            concatenate(&[rotated, x.at((Ellipsis, self.dims..))?], -1)?
        }))
    }

    fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        let scaled = self.scaled_input(x)?;
        let x = scaled.as_ref().unwrap_or(x);
        in_pieces(x, rows_per_call(self.dims / 2, x), |x, _| {
            Ok(rope(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                offset,
                self.freqs.as_ref(),
            )?)
        })
    }

    /// Like [`Rope::apply`] for `x` of shape `(n, heads, 1, dim)` whose row
    /// `i` is at position `positions[i]` (MLX computes a scalar offset the
    /// same way).
    fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        let scaled = self.scaled_input(x)?;
        let x = scaled.as_ref().unwrap_or(x);
        self.apply_at_in_pieces(x, positions, rows_per_call(self.dims / 2, x))
    }

    fn apply_at_in_pieces(&self, x: &Array, positions: &Array, per_call: i32) -> Result<Array> {
        in_pieces(x, per_call, |x, rows| {
            let positions = match rows {
                Some(rows) => positions.at(rows)?,
                None => positions.clone(),
            };
            Ok(rope_dynamic(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                &positions,
                self.freqs.as_ref(),
            )?)
        })
    }
}

/// `rope` of `x` whole (`None`), or of pieces of `per_call` entries of its
/// leading axis (each with its range), joined again.
fn in_pieces(
    x: &Array,
    per_call: i32,
    rope: impl Fn(&Array, Option<std::ops::Range<i32>>) -> Result<Array>,
) -> Result<Array> {
    let rows = x.dim(0);
    if per_call >= rows {
        return rope(x, None);
    }
    let pieces = (0..rows)
        .step_by(per_call as usize)
        .map(|start| {
            let range = start..(start + per_call).min(rows);
            rope(&x.at(range.clone())?, Some(range))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(concatenate(&pieces, 0)?)
}

/// [`rope_rows_per_call`] for `x` `(rows, heads, len, dim)` and `pairs`
/// rotated pairs, on MLX's default device.
fn rows_per_call(pairs: i32, x: &Array) -> i32 {
    rope_rows_per_call(pairs, x.dim(1), x.dim(2), x.dim(0), || {
        Device::try_default()
            .and_then(|d| d.get_type())
            .is_ok_and(|t| matches!(t, DeviceType::Gpu))
    })
}

/// How many of `rows` entries of `heads` heads of `len` positions one
/// call to MLX's RoPE takes: all of them, except on a GPU (`gpu` is asked
/// only then) where MLX 0.32's CUDA kernel would ask for a thread block
/// deeper than CUDA's 64. Its block (`get_block_dims_common`) doubles in
/// turn along the rotated pairs, the positions and `rows * ceil(heads /
/// 4)`, 10 doublings in all: where the first two take 3 or fewer (under 16
/// pairs at one position) and the third is 128 or more, it reaches 128
/// deep and the step fails ("cudaGraphAddKernelNode ... invalid
/// argument"). Rotary widths of 32 or more (every family served here)
/// never meet it; smaller ones (tiny custom models) go in pieces under the
/// limit.
fn rope_rows_per_call(
    pairs: i32,
    heads: i32,
    len: i32,
    rows: i32,
    gpu: impl FnOnce() -> bool,
) -> i32 {
    let depth = (heads + 3) / 4;
    let wide = pairs.max(1).ilog2() + len.max(1).ilog2() > 3;
    if wide || rows * depth < 128 || !gpu() {
        rows
    } else {
        (127 / depth).max(1)
    }
}

/// The keys and values of a packed step, all in the pool: its decoding
/// rows (the first rows, one token each), then its prompt chunks.
pub(crate) struct Packed<'a> {
    pub(crate) pool: &'a mut KvPool,
    /// The pool row of every new position of the step, `(1, n, 1)` int32:
    /// the decoding rows', then each chunk group's (sequence by sequence):
    /// one write per layer stores them all.
    pub(crate) rows: RowIndex,
    pub(crate) decode: Option<Decode>,
    pub(crate) chunks: Vec<Chunks>,
    /// Image soft tokens in place of their ids' embeddings: each `(at,
    /// rows)` puts `rows` (`(len, hidden)`, already divided by
    /// `sqrt(hidden)`, see `images`) at positions `at..at + len` of the
    /// step's input, in order and apart.
    pub(crate) soft_tokens: Vec<(i32, Array)>,
}

/// The decoding rows of a packed step.
pub(crate) struct Decode {
    /// Each decoding token's position (its RoPE offset), `(n,)` int32.
    pub(crate) positions: Array,
    /// The first rows, those whose logits the step wants: the rows after
    /// them are tokens of first prompt chunks, attending as decoding rows
    /// do, each to its sequence's positions up to its own.
    pub(crate) logits: i32,
    /// Consecutive runs of decoding rows that attend over the same padded
    /// length, in row order.
    pub(crate) groups: Vec<Group>,
    /// With `BatchOptions::paged_attention` on: every row's page table, for
    /// one kernel a layer over all rows (`src/paged.rs`).
    pub(crate) paged: Option<PagedRead>,
}

/// The decoding rows' pages as the paged attention kernel reads them.
pub(crate) struct PagedRead {
    /// `(rows, pages)` int32: row `i`'s pages in order, padded with 0.
    pub(crate) table: Array,
    /// `(rows,)` int32: the positions each row attends to (its own included).
    pub(crate) lens: Array,
}

/// Decoding rows that attend together: one gather and one attention kernel.
pub(crate) struct Group {
    /// How many rows.
    pub(crate) rows: i32,
    /// The length each reads, a multiple of the pool's bucket.
    pub(crate) padded: i32,
    /// The pool rows each reads, `(1, rows * padded, 1)` int32, row by row;
    /// padding repeats a row of the sequence's own, which the mask hides.
    pub(crate) index: RowIndex,
    /// Which of those positions are the sequence's, per key/value head as
    /// the pool's gather lays them out: `(kv_heads * rows, 1, 1, padded)`
    /// bool, head `h` of row `i` at `h * rows + i`.
    pub(crate) mask: Array,
    /// What the sliding-window layers read instead, if the model has any.
    pub(crate) window: Option<WindowRead>,
}

/// The reads of a decoding group's sliding-window layers: each row's
/// window in the order mlx-lm sums it (`window::decoding_positions`),
/// padded and masked as [`Group`]'s reads are.
pub(crate) struct WindowRead {
    /// The length each reads: the group's, or the window's rounded up to
    /// the pool's bucket where that is shorter.
    pub(crate) padded: i32,
    /// As [`Group::index`], for `padded` positions a row.
    pub(crate) index: RowIndex,
    /// As [`Group::mask`].
    pub(crate) mask: Array,
}

/// Prompt chunks of `seqs` sequences, each `len` tokens from position
/// `offset`, side by side in the step: they attend as one batch, with the
/// shapes of one chunk alone.
pub(crate) struct Chunks {
    pub(crate) seqs: i32,
    pub(crate) offset: i32,
    pub(crate) len: i32,
    /// From a later chunk on (`offset > 0`), the pool rows of every position
    /// each sequence reads, its earlier ones and the chunk's: `(1, seqs *
    /// (offset + len), 1)` int32, sequence by sequence. A first chunk
    /// attends to its own keys and values alone.
    pub(crate) index: Option<RowIndex>,
    /// The RoPE position of each token, `(len,)` int32, where they are not
    /// `offset..offset + len` (a prompt prefilled in part, see
    /// `specprefill`); such a group holds one sequence.
    pub(crate) positions: Option<Array>,
}

/// Su / LongRoPE frequencies with the ops of mlx-lm's `SuScaledRoPE`:
/// `long_factor * base ** (arange(0, dims, 2) / dims)`, in float32.
fn su_freqs(dims: i32, base: f32, long_factor: &[f32]) -> Result<Array> {
    let exponents =
        arange::<_, f32>(0.0, dims as f64, 2.0)?.divide(Array::from_f32(dims as f32))?;
    let freqs = Array::from_f32(base).power(&exponents)?;
    let factors = Array::from_slice(long_factor, &[long_factor.len() as i32]);
    let freqs = factors.multiply(&freqs)?;
    eval([&freqs])?;
    Ok(freqs)
}

/// Llama 3.1's scaled RoPE frequencies, with the same ops and the same
/// float32/float64 mix as mlx-lm's `Llama3RoPE`.
fn llama3_freqs(
    dims: i32,
    base: f32,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    old_context: f32,
) -> Result<Array> {
    let scalar = |v: f64| Array::from_f32(v as f32);
    let (factor, low, high, old) = (
        factor as f64,
        low_freq_factor as f64,
        high_freq_factor as f64,
        old_context as f64,
    );
    let exponents = arange::<_, i32>(0, dims, 2)?.divide(Array::from_int(dims))?;
    let freqs = scalar(base as f64).power(&exponents)?;
    let wavelens = freqs.multiply(scalar(2.0 * std::f64::consts::PI))?;
    let low_wavelen = scalar(old / low);
    let high_wavelen = scalar(old / high);
    let freqs = select(
        wavelens.gt(&low_wavelen)?,
        freqs.multiply(scalar(factor))?,
        &freqs,
    )?;
    let medium = wavelens
        .gt(&high_wavelen)?
        .logical_and(wavelens.lt(&low_wavelen)?)?;
    let smooth = scalar(old)
        .divide(&wavelens)?
        .subtract(scalar(low))?
        .divide(scalar(high - low))?;
    let smooth_freqs = freqs.divide(
        Array::from_int(1)
            .subtract(&smooth)?
            .divide(scalar(factor))?
            .add(&smooth)?,
    )?;
    let freqs = select(medium, smooth_freqs, freqs)?;
    eval([&freqs])?;
    Ok(freqs)
}

/// YaRN's frequencies and `mscale`, with the same ops, dtypes and float64
/// arithmetic as mlx-lm's `YarnRoPE`.
fn yarn_freqs(
    dims: i32,
    base: f32,
    factor: f32,
    original_context: f32,
    (beta_fast, beta_slow): (f32, f32),
    (mscale, mscale_all_dim): (f32, f32),
) -> Result<(Array, f32)> {
    let (d, b, context) = (dims as f64, base as f64, original_context as f64);
    let correction_dim = |rotations: f64| {
        d * (context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * b.ln())
    };
    let low = correction_dim(beta_fast as f64).floor().max(0.0);
    let mut high = correction_dim(beta_slow as f64).ceil().min(d - 1.0);
    if low == high {
        high += 0.001; // mlx-lm's guard against a zero-width ramp
    }
    let get_mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let factor = factor as f64;
    let scale = get_mscale(factor, mscale as f64) / get_mscale(factor, mscale_all_dim as f64);
    let scalar = |v: f64| Array::from_f32(v as f32);
    let exponents = arange::<_, f32>(0.0, d as f32, 2.0)?.divide(scalar(d))?;
    let freq_extra = scalar(b).power(&exponents)?;
    let freq_inter = scalar(factor).multiply(&freq_extra)?;
    let ramp = arange::<_, f32>(0.0, (dims / 2) as f32, 1.0)?
        .subtract(scalar(low))?
        .divide(scalar(high - low))?;
    let ramp = clip(&ramp, (&scalar(0.0), &scalar(1.0)))?;
    let freq_mask = scalar(1.0).subtract(&ramp)?;
    let freqs = freq_inter.multiply(&freq_extra)?.divide(
        freq_inter
            .multiply(&freq_mask)?
            .add(freq_extra.multiply(scalar(1.0).subtract(&freq_mask)?)?)?,
    )?;
    eval([&freqs])?;
    Ok((freqs, scale as f32))
}

/// An attention mask as [`Attention::sdpa_heads`] slices it by heads.
#[derive(Clone, Copy)]
enum Mask<'a> {
    None,
    /// Causal, aligned to the end of the keys.
    Causal,
    /// One mask for every row of the batch axis.
    Shared(&'a Array),
    /// One mask per row of the batch axis (its first axis).
    Rows(&'a Array),
}

#[derive(Clone)]
struct Attention {
    /// Queries, keys and values.
    qkv: Projections,
    o_proj: Linear,
    /// Qwen3's and Gemma's per-head RMS norms of queries and keys.
    qk_norms: Option<(Array, Array)>,
    num_heads: i32,
    num_kv_heads: i32,
    scale: f32,
    /// A sliding-window layer's window (see `window`).
    window: Option<i32>,
    eps: f32,
    /// Attention of different key/value heads is independent: long
    /// attentions are split by heads over the CPU streams.
    parallel: Parallel,
    /// gpt-oss's learned logit per query head, `(num_heads,)`, that each
    /// head's softmax adds beside its keys'.
    sinks: Option<Array>,
}

/// The query, key and value projections of some tokens, before they are
/// split into heads: one array when the projections are fused.
enum Projected {
    Joined(Array),
    Split([Array; 3]),
}

impl Projected {
    /// `(1, seqs * len, ...)` as `(seqs, len, ...)`: the chunks of a group
    /// as a batch (the same memory).
    fn batch(self, seqs: i32) -> Result<Self> {
        let batch = |a: Array| -> Result<Array> {
            let len = a.dim(1) / seqs;
            Ok(a.reshape(&[seqs, len, -1])?)
        };
        Ok(match self {
            Self::Joined(a) => Self::Joined(batch(a)?),
            Self::Split([q, k, v]) => Self::Split([batch(q)?, batch(k)?, batch(v)?]),
        })
    }

    /// The tokens of each sequence of a packed batch, split before each
    /// of `starts` (one op per array, however many sequences).
    fn split_rows(self, starts: &[i32]) -> Result<Vec<Self>> {
        let split = |a: Array| a.split_at_indices(starts, 1);
        Ok(match self {
            Self::Joined(a) => split(a)?.into_iter().map(Self::Joined).collect(),
            Self::Split([q, k, v]) => {
                let (q, k, v) = (split(q)?, split(k)?, split(v)?);
                q.into_iter()
                    .zip(k)
                    .zip(v)
                    .map(|((q, k), v)| Self::Split([q, k, v]))
                    .collect()
            }
        })
    }
}

impl Attention {
    /// The attention's output, plus `residual` where there is one.
    fn forward(
        &self,
        x: &Array,
        cache: &mut KvCache,
        rope: &Rope,
        residual: Option<&Array>,
    ) -> Result<Array> {
        let out = self.attend_one(self.project(x)?, cache, rope)?;
        self.o_proj.forward_plus(&out, residual)
    }

    /// Attention of a packed step: `x` is `(1, n, hidden)`, the decoding
    /// rows first (one token each), then each chunk group's tokens. Every
    /// new key and value goes to `layer`'s pool (of `layers`) with one
    /// write; then each decoding group attends with one gather and one
    /// kernel, and each chunk group as one batch. The projections run once
    /// over every token; a sequence's attention computes the same shapes
    /// alone or batched, so a row's result does not depend on its neighbours.
    /// Plus `residual` where there is one.
    fn forward_packed(
        &self,
        x: &Array,
        step: &mut Packed,
        layer: usize,
        layers: usize,
        rope: &Rope,
        residual: Option<&Array>,
    ) -> Result<Array> {
        let projected = self.project(x)?;
        let decoding = step.decode.as_ref().map(|d| d.positions.dim(0));
        let sizes: Vec<i32> = decoding
            .into_iter()
            .chain(step.chunks.iter().map(|c| c.seqs * c.len))
            .collect();
        let mut parts = if sizes.len() == 1 {
            vec![projected]
        } else {
            let starts: Vec<i32> = sizes
                .iter()
                .scan(0, |end, &len| {
                    *end += len;
                    Some(*end)
                })
                .take(sizes.len() - 1)
                .collect();
            projected.split_rows(&starts)?
        }
        .into_iter();
        let kv_heads = self.num_kv_heads;
        // The new keys and values in the pool's layout, `(kv_heads, rows,
        // head_dim)`, in the order of the step's rows.
        let (mut new_keys, mut new_values) = (Vec::new(), Vec::new());
        let decoded = match &step.decode {
            Some(d) => {
                let part = parts.next().expect("a decoding part");
                let (queries, keys, values) = self.decoding_heads(part, &d.positions, rope)?;
                // `(n, kv_heads, 1, head_dim)` to `(kv_heads, n, head_dim)`;
                // for one row the same memory, so a reshape alone.
                let n = d.positions.dim(0);
                let head_major = |y: &Array| -> Result<Array> {
                    Ok(if n == 1 {
                        y.reshape(&[kv_heads, 1, -1])?
                    } else {
                        y.reshape(&[n, kv_heads, -1])?.transpose_axes(&[1, 0, 2])?
                    })
                };
                new_keys.push(head_major(&keys)?);
                new_values.push(head_major(&values)?);
                Some(queries)
            }
            None => None,
        };
        let mut chunks = Vec::with_capacity(step.chunks.len());
        for (part, c) in parts.zip(&step.chunks) {
            let (queries, keys, values) = match &c.positions {
                // One token per row at its own position, then `(1, heads,
                // len, head_dim)` as a chunk's.
                Some(positions) => {
                    let (q, k, v) = self.decoding_heads(part, positions, rope)?;
                    let chunk = |a: Array| a.transpose_axes(&[2, 1, 0, 3]);
                    (chunk(q)?, chunk(k)?, chunk(v)?)
                }
                None => self.heads(part.batch(c.seqs)?, c.offset, rope)?,
            };
            // `(seqs, kv_heads, len, head_dim)` to `(kv_heads, seqs * len, head_dim)`.
            let head_major = |y: &Array| -> Result<Array> {
                Ok(y.transpose_axes(&[1, 0, 2, 3])?
                    .reshape(&[kv_heads, c.seqs * c.len, -1])?)
            };
            new_keys.push(head_major(&keys)?);
            new_values.push(head_major(&values)?);
            chunks.push((queries, keys, values));
        }
        let joined = |mut parts: Vec<Array>| -> Result<Array> {
            Ok(if parts.len() == 1 {
                parts.pop().expect("one part")
            } else {
                concatenate(&parts, 1)?
            })
        };
        let pool = step.pool.write(
            layer,
            layers,
            &step.rows,
            &joined(new_keys)?,
            &joined(new_values)?,
        )?;
        let mut outs = Vec::with_capacity(sizes.len());
        if let (Some(queries), Some(d)) = (decoded, &step.decode) {
            outs.push(self.attend_decoding(queries, d, &pool)?);
        }
        for ((queries, keys, values), c) in chunks.into_iter().zip(&step.chunks) {
            outs.push(self.attend_chunks(queries, keys, values, c, &pool)?);
        }
        self.o_proj.forward_plus(&joined(outs)?, residual)
    }

    /// The decoding rows' queries, keys and values (`(1, n, ...)`
    /// projections of one token each, row `i` at `positions[i]`) as `(n,
    /// heads, 1, head_dim)`: the same memory, as for one token alone.
    fn decoding_heads(
        &self,
        projected: Projected,
        positions: &Array,
        rope: &Rope,
    ) -> Result<(Array, Array, Array)> {
        let n = positions.dim(0);
        let heads = |y: Array, count: i32, norm: Option<&Array>| -> Result<Array> {
            let y = y.reshape(&[n, count, 1, -1])?;
            Ok(match norm {
                Some(w) => rms_norm(&y, Some(w), self.eps)?,
                None => y,
            })
        };
        self.heads_of(projected, heads, |x| rope.apply_at(x, positions))
    }

    /// The decoding rows' attention over the pool `pool` (after this step's
    /// write): each group attends with one gather and one kernel, over its
    /// padded length under its mask. Returns `(1, n, heads * head_dim)`.
    fn attend_decoding(&self, queries: Array, d: &Decode, pool: &(Array, Array)) -> Result<Array> {
        if let Some(paged) = &d.paged {
            if self.window.is_none()
                && self.sinks.is_none()
                && crate::paged::fits(&queries, pool, self.num_kv_heads)
            {
                return crate::paged::attention(
                    &queries,
                    pool,
                    &paged.table,
                    &paged.lens,
                    self.scale,
                    self.num_kv_heads,
                );
            }
        }
        let n = queries.dim(0);
        let (kv_heads, repeats) = (self.num_kv_heads, self.num_heads / self.num_kv_heads);
        let mut outs = Vec::with_capacity(d.groups.len());
        let mut start = 0;
        for group in &d.groups {
            let g = group.rows;
            let q = if g == n {
                queries.clone()
            } else {
                queries.at(start..start + g)?
            };
            start += g;
            // Keys and values come heads first, `(kv_heads * g, 1, padded,
            // head_dim)`: the queries of each key/value head are laid out
            // alike, `(kv_heads * g, repeats, 1, head_dim)`. Each query
            // still attends to its own sequence's keys with its own head.
            // For one row both layouts are the same memory: one reshape.
            let q = if g == 1 {
                q.reshape(&[kv_heads, repeats, 1, -1])?
            } else {
                q.reshape(&[g, kv_heads, repeats, -1])?
                    .transpose_axes(&[1, 0, 2, 3])?
                    .reshape(&[kv_heads * g, repeats, 1, -1])?
            };
            let (index, mask, padded) = match (&group.window, self.window) {
                (Some(w), Some(_)) => (&w.index, &w.mask, w.padded),
                _ => (&group.index, &group.mask, group.padded),
            };
            let (k, v) = KvPool::gather(pool, index, padded)?;
            let out = self.sdpa_heads(&q, &k, &v, Mask::Rows(mask), 0, (0, kv_heads), g, g)?;
            // Back to `(1, g, q_heads * head_dim)`, query heads in order.
            let out = if g == 1 {
                out.reshape(&[1, 1, -1])?
            } else {
                out.reshape(&[kv_heads, g, repeats, -1])?
                    .transpose_axes(&[1, 0, 2, 3])?
                    .reshape(&[1, g, -1])?
            };
            outs.push(out);
        }
        Ok(if outs.len() == 1 {
            outs.pop().expect("one group")
        } else {
            concatenate(&outs, 1)?
        })
    }

    /// A chunk group's attention, from its `(seqs, heads, len, head_dim)`
    /// queries, keys and values: a first chunk attends to its own keys and
    /// values, a later one to its sequence's positions gathered from the
    /// pool (after this step's write). Returns `(1, seqs * len, heads *
    /// head_dim)`.
    fn attend_chunks(
        &self,
        queries: Array,
        keys: Array,
        values: Array,
        c: &Chunks,
        pool: &(Array, Array),
    ) -> Result<Array> {
        let window_mask = self
            .window
            .and_then(|w| window::prefill_mask(c.offset, c.len, w));
        let out = match &c.index {
            None => self.attend(&queries, &keys, &values, window_mask.as_ref())?,
            Some(index) => {
                let (kv_heads, repeats) = (self.num_kv_heads, self.num_heads / self.num_kv_heads);
                let (b, len) = (c.seqs, c.len);
                // As for decoding: keys and values heads first, `(kv_heads *
                // seqs, 1, offset + len, head_dim)`, and the queries alike.
                let (k, v) = KvPool::gather(pool, index, c.offset + len)?;
                let q = queries
                    .reshape(&[b, kv_heads, repeats, len, -1])?
                    .transpose_axes(&[1, 0, 2, 3, 4])?
                    .reshape(&[kv_heads * b, repeats, len, -1])?;
                self.attend_split(&q, &k, &v, 0, b, b, window_mask.as_ref())?
                    .reshape(&[kv_heads, b, repeats, len, -1])?
                    .transpose_axes(&[1, 0, 2, 3, 4])?
                    .reshape(&[b, kv_heads * repeats, len, -1])?
            }
        };
        Ok(merge_heads(&out)?.reshape(&[1, c.seqs * c.len, -1])?)
    }

    /// Queries, keys and values in heads (`heads` reshapes and norms one
    /// projection), with RoPE (`rope`) on queries and keys: the same ops for
    /// one sequence and for a batch's decoding rows.
    fn heads_of(
        &self,
        projected: Projected,
        heads: impl Fn(Array, i32, Option<&Array>) -> Result<Array>,
        rope: impl Fn(&Array) -> Result<Array>,
    ) -> Result<(Array, Array, Array)> {
        let (q_heads, kv_heads) = (self.num_heads, self.num_kv_heads);
        Ok(match projected {
            // Fused and without per-head norms: the heads of queries, keys
            // and values lie side by side in one output, so one reshape and
            // one transpose serve all three, and one RoPE the queries and
            // keys together (it acts on each head alike): fewer ops to encode
            // per layer, the same numbers.
            // Each split is one op with two outputs where two slices are
            // two (the same views).
            Projected::Joined(qkv) => {
                let all = heads(qkv, q_heads + 2 * kv_heads, None)?;
                let [qk, v] = halves(&all, q_heads + kv_heads)?;
                let [q, k] = halves(&rope(&qk)?, q_heads)?;
                (q, k, v)
            }
            Projected::Split([q, k, v]) => {
                let (q_norm, k_norm) = match &self.qk_norms {
                    Some((q, k)) => (Some(q), Some(k)),
                    None => (None, None),
                };
                (
                    rope(&heads(q, q_heads, q_norm)?)?,
                    rope(&heads(k, kv_heads, k_norm)?)?,
                    heads(v, kv_heads, None)?,
                )
            }
        })
    }

    fn project(&self, x: &Array) -> Result<Projected> {
        Ok(match (self.qkv.joined(), &self.qk_norms) {
            (Some(qkv), None) => Projected::Joined(qkv.forward(x)?),
            _ => Projected::Split(self.qkv.forward(x)?.try_into().expect("three projections")),
        })
    }

    /// One sequence's attention from its projections (`(1, len, ...)`),
    /// appending its keys and values to `cache`; the output before `o_proj`.
    fn attend_one(&self, projected: Projected, cache: &mut KvCache, rope: &Rope) -> Result<Array> {
        let offset = cache.offset();
        let (queries, keys, values) = self.heads(projected, cache.position(), rope)?;
        let (keys, values) = cache.update_and_fetch(&keys, &values)?;
        if let Some(importance) = cache.importance.as_mut() {
            let scores = self.attention_of_last(&queries, &keys, importance.last)?;
            importance.sum = Some(match importance.sum.take() {
                Some(sum) => sum.add(&scores)?,
                None => scores,
            });
        }
        let len = queries.dim(2);
        let out = match self.window {
            Some(w) if len == 1 => {
                let base = cache.prefilled();
                let keys = window::decoding_view(&keys, base, w)?;
                let values = window::decoding_view(&values, base, w)?;
                self.attend(&queries, &keys, &values, None)?
            }
            Some(w) => {
                let mask = window::prefill_mask(offset, len, w);
                self.attend(&queries, &keys, &values, mask.as_ref())?
            }
            None => self.attend(&queries, &keys, &values, None)?,
        };
        merge_heads(&out)
    }

    /// The attention weights of the last `last` of one sequence's queries
    /// (`(1, heads, len, head_dim)`) over all its keys (`(1, kv_heads,
    /// positions, head_dim)`), causal, summed over heads and queries:
    /// `(positions,)` float32. What SpecPrefill's scorer reads.
    fn attention_of_last(&self, queries: &Array, keys: &Array, last: i32) -> Result<Array> {
        let (len, positions) = (queries.dim(2), keys.dim(2));
        let last = last.clamp(1, len);
        let (kv_heads, repeats) = (self.num_kv_heads, self.num_heads / self.num_kv_heads);
        let q = queries
            .at((.., .., len - last..))?
            .as_dtype(mlx_rs::Dtype::Float32)?
            .reshape(&[kv_heads, repeats * last, -1])?;
        let k = keys
            .as_dtype(mlx_rs::Dtype::Float32)?
            .reshape(&[kv_heads, positions, -1])?;
        let scores = q
            .matmul(&k.transpose_axes(&[0, 2, 1])?)?
            .multiply(Array::from_f32(self.scale))?
            .reshape(&[kv_heads, repeats, last, positions])?;
        // Query r (at position positions - last + r) sees keys up to it.
        let rows = arange::<_, i32>(positions - last, positions, None)?.reshape(&[last, 1])?;
        let cols = arange::<_, i32>(0, positions, None)?.reshape(&[1, positions])?;
        let visible = cols.le(&rows)?;
        let scores = select(&visible, &scores, Array::from_f32(f32::NEG_INFINITY))?;
        let weights = mlx_rs::ops::softmax_axis(&scores, -1, None)?;
        Ok(weights.sum_axes(&[0, 1, 2], false)?)
    }

    /// Queries, keys and values of `(batch, len, ...)` projections as
    /// `(batch, heads, len, head_dim)`, with RoPE from position `offset`.
    fn heads(
        &self,
        projected: Projected,
        offset: i32,
        rope: &Rope,
    ) -> Result<(Array, Array, Array)> {
        let first = match &projected {
            Projected::Joined(a) => a,
            Projected::Split([q, _, _]) => q,
        };
        let (batch, len) = (first.dim(0), first.dim(1));
        // `(batch, len, n * head_dim)` to `(batch, n, len, head_dim)`. For one
        // token (decoding) both layouts are the same memory, so a reshape
        // alone does it: one op less to encode per use, every step.
        let heads = |y: Array, n: i32, norm: Option<&Array>| -> Result<Array> {
            let one = len == 1;
            let y = y.reshape(&if one {
                [batch, n, 1, -1]
            } else {
                [batch, len, n, -1]
            })?;
            let y = match norm {
                Some(w) => rms_norm(&y, Some(w), self.eps)?,
                None => y,
            };
            Ok(if one {
                y
            } else {
                y.transpose_axes(&[0, 2, 1, 3])?
            })
        };
        self.heads_of(projected, heads, |x| rope.apply(x, offset))
    }
}

/// `heads` `(batch, n, ...)` split before head `at`.
fn halves(heads: &Array, at: i32) -> Result<[Array; 2]> {
    let [first, second]: [Array; 2] = heads
        .split_at_indices(&[at], 1)?
        .try_into()
        .expect("one index makes two parts");
    Ok([first, second])
}

/// Attention's output `(batch, heads, len, head_dim)` as `(batch, len, heads
/// * head_dim)`: for one token the same memory, so a reshape alone.
fn merge_heads(out: &Array) -> Result<Array> {
    let (batch, len) = (out.dim(0), out.dim(2));
    Ok(if len == 1 {
        out.reshape(&[batch, 1, -1])?
    } else {
        out.transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[batch, len, -1])?
    })
}

impl Attention {
    /// Scaled dot-product attention of `(batch, heads, len, head_dim)`
    /// queries over all cached keys and values; causal, or under `mask`
    /// (`(len, keys)`, a sliding window's).
    fn attend(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let repeats = self.num_heads / self.num_kv_heads;
        self.attend_split(queries, keys, values, 1, repeats, 1, mask)
    }

    /// Scaled dot-product attention whose key/value heads lie along `axis`
    /// (0 or 1), `q_per` query rows and `kv_per` key rows of that axis per
    /// head; one kernel, or on the CPU, for long attentions, one per range
    /// of heads over the CPU streams (heads are independent). `mask`
    /// replaces the causal mask.
    #[allow(clippy::too_many_arguments)]
    fn attend_split(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        axis: i32,
        q_per: i32,
        kv_per: i32,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let len = queries.dim(2);
        // One query attends to every cached key; several (prefill) need the
        // causal mask, which the kernel aligns to the end of the keys.
        let mask = match mask {
            Some(mask) => Mask::Shared(mask),
            None if len > 1 => Mask::Causal,
            None => Mask::None,
        };
        let sdpa = |q: &Array, k: &Array, v: &Array, heads: (i32, i32)| -> Result<Array> {
            self.sdpa_heads(q, k, v, mask, axis, heads, q_per, kv_per)
        };
        let work = queries.size() * keys.dim(2) as usize;
        let parts = self.parallel.parts(self.num_kv_heads as usize, work);
        if parts == 1 {
            return sdpa(queries, keys, values, (0, self.num_kv_heads));
        }
        let slice = |a: &Array, range: std::ops::Range<i32>| -> Result<Array> {
            Ok(if axis == 0 {
                a.at(range)?
            } else {
                a.at((.., range))?
            })
        };
        let outs = (0..parts)
            .map(|i| {
                let (start, end) = Parallel::bounds(self.num_kv_heads, parts, i);
                let q = slice(queries, start * q_per..end * q_per)?;
                let k = slice(keys, start * kv_per..end * kv_per)?;
                let v = slice(values, start * kv_per..end * kv_per)?;
                self.parallel.on(i, || sdpa(&q, &k, &v, (start, end)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(concatenate(&outs, axis)?)
    }

    /// One attention kernel over key/value heads `heads` (`start..end`),
    /// whose rows these are: along `axis` (0 or 1), `q_per` query rows and
    /// `kv_per` key rows per head. With sinks, each query head gets its own;
    /// the kernel takes them by query head of axis 1, so where the heads lie
    /// along axis 0 each key/value head has a kernel of its own.
    #[allow(clippy::too_many_arguments)]
    fn sdpa_heads(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        mask: Mask,
        axis: i32,
        (start, end): (i32, i32),
        q_per: i32,
        kv_per: i32,
    ) -> Result<Array> {
        let kernel = |q: &Array, k: &Array, v: &Array, mask: Mask, sinks: Option<&Array>| {
            let mask = match mask {
                Mask::None => None,
                Mask::Causal => Some(ScaledDotProductAttentionMask::Causal),
                Mask::Shared(m) | Mask::Rows(m) => Some(ScaledDotProductAttentionMask::Array(m)),
            };
            scaled_dot_product_attention(q, k, v, self.scale, mask, sinks)
        };
        let Some(sinks) = &self.sinks else {
            return Ok(kernel(q, k, v, mask, None)?);
        };
        let repeats = self.num_heads / self.num_kv_heads;
        if axis == 1 {
            let sinks = sinks.at(start * repeats..end * repeats)?;
            return Ok(kernel(q, k, v, mask, Some(&sinks))?);
        }
        let outs = (0..end - start)
            .map(|i| {
                let h = start + i;
                let rows_mask;
                let mask = match mask {
                    Mask::Rows(m) => {
                        rows_mask = m.at(i * q_per..(i + 1) * q_per)?;
                        Mask::Rows(&rows_mask)
                    }
                    other => other,
                };
                let sinks = sinks.at(h * repeats..(h + 1) * repeats)?;
                Ok(kernel(
                    &q.at(i * q_per..(i + 1) * q_per)?,
                    &k.at(i * kv_per..(i + 1) * kv_per)?,
                    &v.at(i * kv_per..(i + 1) * kv_per)?,
                    mask,
                    Some(&sinks),
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(concatenate(&outs, 0)?)
    }
}

#[derive(Clone)]
struct Mlp {
    /// The gate and up projections.
    gate_up: Projections,
    down_proj: Linear,
    /// What the gate goes through.
    activation: Activation,
}

/// The gate's nonlinearity of a gated MLP.
#[derive(Clone, Copy)]
enum Activation {
    /// `silu(gate) * up` (mlx-lm's compiled `swiglu`).
    Silu,
    /// `gelu_approx(gate) * up` (Gemma).
    GeluApprox,
}

impl Mlp {
    /// The MLP's output, plus `residual` where there is one.
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let [gate, up]: [Array; 2] = self
            .gate_up
            .forward(x)?
            .try_into()
            .expect("two projections");
        let gated = match self.activation {
            Activation::Silu => swiglu(&gate, &up)?,
            Activation::GeluApprox => gemma::gelu_approx(&gate)?.multiply(&up)?,
        };
        self.down_proj.forward_plus(&gated, residual)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut all = self.gate_up.arrays();
        all.extend(self.down_proj.arrays());
        all
    }
}

/// A block's MLP: dense, or a mixture of routed experts.
#[derive(Clone)]
enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoe),
}

impl FeedForward {
    /// The block's MLP output, plus `residual` where there is one.
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        match (self, residual) {
            (Self::Dense(mlp), residual) => mlp.forward(x, residual),
            (Self::Sparse(moe), None) => moe.forward(x),
            (Self::Sparse(moe), Some(residual)) => Ok(residual.add(moe.forward(x)?)?),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            Self::Dense(mlp) => mlp.arrays(),
            Self::Sparse(moe) => moe.arrays(),
        }
    }
}

/// A compiled function of two arrays, as `mlx_rs::transforms::compile` makes it.
type Compiled2 = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> mlx_rs::error::Result<Array>>;

thread_local! {
    /// `swiglu`, compiled once per stream of this thread. mlx-rs's own
    /// `silu` compiles afresh on every call (a new function id, dropped after
    /// the call), which traces and fuses the graph again for every layer of
    /// every step; and MLX replays a compiled graph on the stream it was
    /// traced on, hence one per stream.
    static SWIGLU: RefCell<HashMap<i32, Compiled2>> = RefCell::new(HashMap::new());
}

thread_local! {
    /// `swiglu_clamped`, compiled once per stream of this thread and
    /// constants (as `SWIGLU`).
    static SWIGLU_CLAMPED: RefCell<HashMap<(i32, u32, u32), Compiled2>> =
        RefCell::new(HashMap::new());
}

/// gpt-oss's `swiglu_oai` as mlx-lm computes it (compiled, shapeless): the
/// gate clamped from above at `limit`, `x` to `[-limit, limit]`, then
/// `(x + 1) * gate * sigmoid(alpha * gate)`, the constants in the gate's dtype.
fn swiglu_clamped(gate: &Array, x: &Array, alpha: f32, limit: f32) -> Result<Array> {
    let stream = Stream::thread_local_or_default().get_index()?;
    SWIGLU_CLAMPED.with_borrow_mut(|compiled| {
        let key = (stream, alpha.to_bits(), limit.to_bits());
        let f = compiled.entry(key).or_insert_with(|| {
            let f = move |(gate, x): (&Array, &Array)| {
                let scalar = |v: f32| Array::from_f32(v).as_dtype(gate.dtype());
                let gate = minimum(gate, scalar(limit)?)?;
                let x = clip(x, (&scalar(-limit)?, &scalar(limit)?))?;
                let glu = gate.multiply(sigmoid(scalar(alpha)?.multiply(&gate)?)?)?;
                x.add(scalar(1.0)?)?.multiply(glu)
            };
            Box::new(compile(f, true))
        });
        Ok(f((gate, x))?)
    })
}

/// mlx-lm's `swiglu`: `silu(gate) * x`, compiled (shapeless) into one kernel.
fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    let stream = Stream::thread_local_or_default().get_index()?;
    SWIGLU.with_borrow_mut(|compiled| {
        let f = compiled.entry(stream).or_insert_with(|| {
            let f = |(gate, x): (&Array, &Array)| gate.multiply(sigmoid(gate)?)?.multiply(x);
            Box::new(compile(f, true))
        });
        Ok(f((gate, x))?)
    })
}

#[derive(Clone)]
struct Block {
    attention: Attention,
    mlp: FeedForward,
    input_norm: Array,
    /// The MLP's input norm; with `feedforward_norms`, the norm of the
    /// attention's output instead.
    post_attention_norm: Array,
    /// Gemma's norms of the MLP's input and output (`pre_feedforward` and
    /// `post_feedforward_layernorm`): both sublayers' outputs are normed
    /// before their residual sum, which is clipped in float16.
    feedforward_norms: Option<(Array, Array)>,
    eps: f32,
}

impl Block {
    fn forward(&self, x: &Array, cache: &mut KvCache, rope: &Rope) -> Result<Array> {
        let normed = rms_norm(x, Some(&self.input_norm), self.eps)?;
        let r = self
            .attention
            .forward(&normed, cache, rope, self.residual_in_attention(x))?;
        self.after_attention(x, &r)
    }

    /// `x`, where the attention's output projection adds the residual
    /// itself: everywhere but Gemma, which norms that output first.
    fn residual_in_attention<'a>(&self, x: &'a Array) -> Option<&'a Array> {
        self.feedforward_norms.is_none().then_some(x)
    }

    /// After the attention's output `r` (with the residual `x` already
    /// added, but for Gemma), the MLP and its residual sum.
    fn after_attention(&self, x: &Array, r: &Array) -> Result<Array> {
        let norm = |a: &Array, w: &Array| rms_norm(a, Some(w), self.eps);
        match &self.feedforward_norms {
            None => self
                .mlp
                .forward(&norm(r, &self.post_attention_norm)?, Some(r)),
            Some((pre, post)) => {
                let h = gemma::residual(x, &norm(r, &self.post_attention_norm)?)?;
                let r = self.mlp.forward(&norm(&h, pre)?, None)?;
                gemma::residual(&h, &norm(&r, post)?)
            }
        }
    }

    fn forward_packed(
        &self,
        x: &Array,
        step: &mut Packed,
        layer: usize,
        layers: usize,
        rope: &Rope,
    ) -> Result<Array> {
        let r = self.attention.forward_packed(
            &rms_norm(x, Some(&self.input_norm), self.eps)?,
            step,
            layer,
            layers,
            rope,
            self.residual_in_attention(x),
        )?;
        self.after_attention(x, &r)
    }
}

impl Block {
    fn arrays(&self) -> Vec<&Array> {
        let a = &self.attention;
        let mut all = a.qkv.arrays();
        all.extend(a.o_proj.arrays());
        if let Some((q, k)) = &a.qk_norms {
            all.extend([q, k]);
        }
        all.extend(&a.sinks);
        all.extend(self.mlp.arrays());
        all.extend([&self.input_norm, &self.post_attention_norm]);
        if let Some((pre, post)) = &self.feedforward_norms {
            all.extend([pre, post]);
        }
        all
    }

    /// Takes the weights of the block at `p` (layer `i` of the model
    /// `config` describes), laid out by `l`.
    fn take(
        w: &mut Weights,
        p: &str,
        i: usize,
        config: &ModelConfig,
        l: &Layout,
        fuse: bool,
        on_cpu: bool,
    ) -> Result<Self> {
        let family = config.family;
        let gemma = family == Family::Gemma3;
        let q = config.quantization.as_ref();
        // Gemma's norms weigh `1 + w`.
        let norm_weight = |w: Array| -> Result<Array> {
            if gemma {
                gemma::norm_weight(&w)
            } else {
                Ok(w)
            }
        };
        let (head_dim, heads, kv_heads) = (config.head_dim, config.num_heads, config.num_kv_heads);
        let attn = |name: &str| format!("{p}.self_attn.{name}");
        let mlp = |name: &str| format!("{p}.mlp.{name}");
        let sinks = if config.attention_sinks {
            Some(w.take(&attn("sinks"))?)
        } else {
            None
        };
        let qk_norms = if matches!(family, Family::Qwen3 | Family::Gemma3 | Family::Qwen3Moe) {
            Some((
                norm_weight(w.take(&attn("q_norm.weight"))?)?,
                norm_weight(w.take(&attn("k_norm.weight"))?)?,
            ))
        } else {
            None
        };
        let qkv = if family == Family::Phi3 {
            let ends = vec![heads * head_dim, (heads + kv_heads) * head_dim];
            Projections::take_fused(w, &attn("qkv_proj"), ends, q, l)?
        } else {
            Projections::take(
                w,
                &[attn("q_proj"), attn("k_proj"), attn("v_proj")],
                config.qkv_bias,
                q,
                l,
                fuse,
            )?
        };
        let window = config
            .sliding_window
            .as_ref()
            .filter(|sw| sw.layers[i])
            .map(|sw| sw.size);
        let attention = Attention {
            qkv,
            o_proj: Linear::take(w, &attn("o_proj"), config.o_bias, q, l)?,
            qk_norms,
            num_heads: heads,
            num_kv_heads: kv_heads,
            scale: config.attention_scale,
            window,
            eps: config.rms_norm_eps,
            parallel: l.parallel.clone(),
            sinks,
        };
        let mlp = match &config.moe {
            Some(moe) if moe.sparse_layers[i] => FeedForward::Sparse(SparseMoe::take(
                w,
                &format!("{p}.mlp"),
                family,
                moe,
                q,
                l,
                on_cpu,
            )?),
            _ => {
                let gate_up = if family == Family::Phi3 {
                    let ends = vec![config.intermediate_size];
                    Projections::take_fused(w, &mlp("gate_up_proj"), ends, q, l)?
                } else {
                    Projections::take(
                        w,
                        &[mlp("gate_proj"), mlp("up_proj")],
                        config.mlp_bias,
                        q,
                        l,
                        fuse,
                    )?
                };
                FeedForward::Dense(Mlp {
                    gate_up,
                    down_proj: Linear::take(w, &mlp("down_proj"), config.mlp_bias, q, l)?,
                    activation: if gemma {
                        Activation::GeluApprox
                    } else {
                        Activation::Silu
                    },
                })
            }
        };
        let mut norm = |n: &str| norm_weight(w.take(&format!("{p}.{n}.weight"))?);
        let input_norm = norm("input_layernorm")?;
        let post_attention_norm = norm("post_attention_layernorm")?;
        let feedforward_norms = if gemma {
            Some((
                norm("pre_feedforward_layernorm")?,
                norm("post_feedforward_layernorm")?,
            ))
        } else {
            None
        };
        Ok(Block {
            attention,
            mlp,
            input_norm,
            post_attention_norm,
            feedforward_norms,
            eps: config.rms_norm_eps,
        })
    }
}

/// How weights are laid out on the default device (see [`Layout`]), and
/// whether that device is the CPU.
fn layout_for(options: &LoadOptions) -> Result<(Layout, bool)> {
    let on_cpu = matches!(Device::try_default()?.get_type()?, DeviceType::Cpu);
    let layout = if on_cpu {
        Layout {
            pretranspose: true,
            parallel: Parallel::cpu(options.cpu_threads.max(1), options.split_min_work)?,
            custom_qmv: false,
            custom_gather_qmv: false,
            sums_by_rows: options.sums_by_rows.unwrap_or(false),
        }
    } else {
        // GPU kernels read the row-major weights best, and one kernel
        // already uses the whole device.
        Layout {
            pretranspose: false,
            parallel: Parallel::none(),
            // A CUDA kernel: not for Metal.
            custom_qmv: options.custom_qmv && cfg!(target_os = "linux"),
            custom_gather_qmv: options.custom_gather_qmv && cfg!(target_os = "linux"),
            sums_by_rows: options.sums_by_rows.unwrap_or(true),
        }
    };
    Ok((layout, on_cpu))
}

/// A loaded model: weights on the default device, ready to run.
#[derive(Clone)]
pub struct Model {
    config: ModelConfig,
    embed: Embedding,
    /// Gemma's embedding scale (see `gemma::embed_scale`).
    embed_scale: Option<Array>,
    blocks: Vec<Block>,
    norm: Array,
    /// `None` when the output projection is tied to the embedding.
    lm_head: Option<Linear>,
    rope: Rope,
    /// The RoPE of sliding-window layers, where the model has them.
    local_rope: Option<Rope>,
    /// Multi-token-prediction layers (MiMo), where the checkpoint has them.
    mtp: Vec<mtp::MtpLayer>,
}

impl Model {
    /// Loads the weights of `dir` for `config` and evaluates them, so the
    /// first request does not pay for reading the files.
    pub fn load(dir: &Path, mut config: ModelConfig, options: &LoadOptions) -> Result<Self> {
        let (layout, on_cpu) = layout_for(options)?;
        let fuse = options.fuse_projections.unwrap_or(!on_cpu);
        let mut w = Weights::load(dir)?;
        let q = config.quantization.as_ref();
        let l = &layout;
        let family = config.family;
        let gemma = family == Family::Gemma3;
        // Tensor names: `language_model.` first for a vision-language folder.
        let prefix = config.weights_prefix.clone();
        let name = |n: &str| format!("{prefix}{n}");
        if gemma {
            // mlx-lm's `sanitize`: tied exactly when there is no output layer.
            config.tie_word_embeddings = !w.contains(&name("lm_head.weight"));
        }
        // Gemma's norms weigh `1 + w`.
        let norm_weight = |w: Array| -> Result<Array> {
            if gemma {
                gemma::norm_weight(&w)
            } else {
                Ok(w)
            }
        };
        let embed = Embedding::take(
            &mut w,
            &name("model.embed_tokens"),
            q,
            config.tie_word_embeddings,
            l,
        )?;
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = name(&format!("model.layers.{i}"));
            blocks.push(Block::take(&mut w, &p, i, &config, l, fuse, on_cpu)?);
        }
        // MiMo's multi-token-prediction layers, where the checkpoint has
        // them (mlx-lm's converter drops them).
        let mut mtp = Vec::new();
        while config.mtp_layers > 0
            && w.contains(&name(&format!(
                "model.mtp_layers.{}.input_proj.weight",
                mtp.len()
            )))
        {
            let p = name(&format!("model.mtp_layers.{}", mtp.len()));
            mtp.push(mtp::MtpLayer::take(&mut w, &p, &config, l, fuse, on_cpu)?);
        }
        let norm = norm_weight(w.take(&name("model.norm.weight"))?)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(Linear::take(&mut w, &name("lm_head"), false, q, l)?)
        };
        // What mlx-lm's `sanitize` drops: precomputed rotary tables, an
        // output projection that a tied model does not use, and a
        // vision-language folder's vision tower and projector (its images
        // are not served here).
        let tied = config.tie_word_embeddings;
        let vision = !prefix.is_empty();
        let lm_head_name = name("lm_head.");
        w.finish(|n| {
            n.contains("self_attn.rotary_emb.inv_freq")
                || (tied && n.starts_with(&lm_head_name))
                || (vision
                    && (n.starts_with("vision_tower.") || n.starts_with("multi_modal_projector.")))
        })?;
        let rope = Rope::new(&config)?;
        let local_rope = match &config.sliding_window {
            Some(window) => Rope::local(&config, window)?,
            None => None,
        };
        let embed_scale = match gemma {
            true => Some(gemma::embed_scale(config.hidden_size)?),
            false => None,
        };
        let model = Self {
            config,
            embed,
            embed_scale,
            blocks,
            norm,
            lm_head,
            rope,
            local_rope,
            mtp,
        };
        eval(model.arrays())?;
        Ok(model)
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model cut after its first `layers` blocks, with its own final
    /// norm and output projection: a drafter made of the model itself
    /// (self-speculation). Its weights are the model's (arrays share their
    /// memory), so it costs no memory but its cache.
    pub fn first_layers(&self, layers: usize) -> Model {
        let mut config = self.config.clone();
        config.num_layers = layers.min(self.blocks.len());
        Model {
            config,
            blocks: self.blocks[..layers.min(self.blocks.len())].to_vec(),
            mtp: Vec::new(),
            ..self.clone()
        }
    }

    /// A fresh, empty cache with one entry per layer.
    pub(crate) fn new_cache(&self) -> Vec<KvCache> {
        (0..self.blocks.len()).map(|_| KvCache::default()).collect()
    }

    /// How much each token of `tokens` matters to the end of the prompt:
    /// the attention the last `last` tokens give it, summed over every
    /// layer, head and one of those queries. The prompt runs through the
    /// model in chunks of `chunk` tokens, only the last `last` tokens
    /// scored. SpecPrefill's scorer.
    pub fn importance(&self, tokens: &[u32], last: usize, chunk: usize) -> Result<Vec<f32>> {
        let last = last.clamp(1, tokens.len().max(1));
        let (head, tail) = tokens.split_at(tokens.len() - last);
        let mut caches = self.new_cache();
        for part in head.chunks(chunk.max(1)) {
            self.hidden(&crate::session::ids(part)?, &mut caches)?;
            let state: Vec<&Array> = caches.iter().flat_map(KvCache::state).collect();
            eval(state)?;
        }
        for cache in &mut caches {
            cache.importance = Some(crate::cache::Importance {
                last: last as i32,
                sum: None,
            });
        }
        self.hidden(&crate::session::ids(tail)?, &mut caches)?;
        let mut total: Option<Array> = None;
        for cache in &mut caches {
            if let Some(sum) = cache.importance.take().and_then(|i| i.sum) {
                total = Some(match total {
                    Some(t) => t.add(&sum)?,
                    None => sum,
                });
            }
        }
        let total = total.expect("a model has layers");
        eval([&total])?;
        Ok(total.as_slice::<f32>().to_vec())
    }

    /// Runs `ids` (`(1, len)`, appended after the cached positions) through
    /// every block, filling the caches; returns the last hidden states before
    /// the final norm. Lazy: nothing is computed until evaluated.
    pub(crate) fn hidden(&self, ids: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.hidden_of(self.embedded(ids)?, caches)
    }

    /// As [`Model::hidden`], from the embeddings `h` `(1, len, hidden)`
    /// (see [`Model::embedded_with`]).
    pub(crate) fn hidden_of(&self, mut h: Array, caches: &mut [KvCache]) -> Result<Array> {
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            h = block.forward(&h, cache, self.rope_of(block))?;
        }
        Ok(h)
    }

    /// The embeddings of `ids` (scaled, for Gemma).
    fn embedded(&self, ids: &Array) -> Result<Array> {
        self.embedded_with(ids, &[])
    }

    /// The embeddings of `ids` `(1, n)`, with image soft tokens in place
    /// of some (see [`Packed::soft_tokens`]), then scaled, for Gemma: as
    /// mlx-vlm's Gemma 3 scales its merged embeddings, soft tokens too.
    pub(crate) fn embedded_with(&self, ids: &Array, soft_tokens: &[(i32, Array)]) -> Result<Array> {
        let mut h = self.embed.forward(ids)?;
        if !soft_tokens.is_empty() {
            let n = h.dim(1);
            let mut parts = Vec::with_capacity(2 * soft_tokens.len() + 1);
            let mut at = 0;
            for (start, rows) in soft_tokens {
                if *start > at {
                    parts.push(h.at((.., at..*start, ..))?);
                }
                parts.push(rows.as_dtype(h.dtype())?.expand_dims(0)?);
                at = start + rows.dim(0);
            }
            if at < n {
                parts.push(h.at((.., at..n, ..))?);
            }
            h = concatenate(&parts, 1)?;
        }
        match &self.embed_scale {
            Some(scale) => gemma::scale_embedding(&h, scale),
            None => Ok(h),
        }
    }

    /// The RoPE of `block`: the sliding-window layers' own, or the model's.
    fn rope_of(&self, block: &Block) -> &Rope {
        match (&self.local_rope, block.attention.window) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        }
    }

    /// The final-norm hidden states of `ids` (`(1, len)`) from an empty
    /// cache: what a decoder embedder pools. Lazy.
    pub(crate) fn normed_hidden(&self, ids: &Array) -> Result<Array> {
        let h = self.hidden(ids, &mut self.new_cache())?;
        Ok(rms_norm(&h, Some(&self.norm), self.config.rms_norm_eps)?)
    }

    /// Like [`Model::hidden`], then the final norm and output projection:
    /// logits `(1, len, vocab)`.
    pub(crate) fn logits(&self, ids: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let h = self.hidden(ids, caches)?;
        self.head(&h)
    }

    /// Like [`Model::logits`], with the hidden states before the final
    /// norm `(1, len, hidden)`, which an MTP layer reads.
    pub(crate) fn hidden_and_logits(
        &self,
        ids: &Array,
        caches: &mut [KvCache],
    ) -> Result<(Array, Array)> {
        let h = self.hidden(ids, caches)?;
        let logits = self.head(&h)?;
        Ok((h, logits))
    }

    /// One step of a packed batch: the new tokens of `step`'s decoding
    /// rows (one token each), then of its chunk groups, side by side in
    /// `ids` (`(1, n)`); their keys and values go to the pool. Returns the
    /// logits `(1, rows, vocab)` of the decoding rows (`None` when there are
    /// none: the step only prefills), and the hidden states of every new
    /// token before the final norm, `(1, n, hidden)`, in the order of
    /// `ids` (what an MTP layer reads). Lazy.
    pub(crate) fn packed_forward(
        &self,
        ids: &Array,
        step: &mut Packed,
    ) -> Result<(Option<Array>, Array)> {
        let decoding = step.decode.as_ref().map(|d| d.logits).filter(|&n| n > 0);
        let mut h = self.embedded_with(ids, &step.soft_tokens)?;
        let layers = self.blocks.len();
        for (layer, block) in self.blocks.iter().enumerate() {
            h = block.forward_packed(&h, step, layer, layers, self.rope_of(block))?;
        }
        let Some(rows) = decoding else {
            return Ok((None, h));
        };
        let decoded = if rows == h.dim(1) {
            h.clone()
        } else {
            h.at((.., ..rows, ..))?
        };
        Ok((Some(self.head(&decoded)?), h))
    }

    /// Whether every layer reads all of a row's positions, under no
    /// attention sinks: first prompt chunks may then attend as decoding
    /// rows (see `BatchOptions::first_chunks_as_rows`).
    pub(crate) fn reads_every_position(&self) -> bool {
        self.config.sliding_window.is_none()
            && (self.blocks.iter())
                .all(|b| b.attention.window.is_none() && b.attention.sinks.is_none())
    }

    /// Whether the paged attention kernel serves every layer's decoding
    /// rows: [`Self::reads_every_position`], with heads the kernel takes.
    pub(crate) fn pages_everywhere(&self) -> bool {
        self.reads_every_position()
            && self.blocks.iter().all(|b| {
                let a = &b.attention;
                crate::paged::takes_heads(a.num_heads, a.num_kv_heads, self.config.head_dim)
            })
    }

    /// The final norm and output projection.
    fn head(&self, h: &Array) -> Result<Array> {
        self.output(&rms_norm(h, Some(&self.norm), self.config.rms_norm_eps)?)
    }

    /// The output projection of normed hidden states `h`.
    fn output(&self, h: &Array) -> Result<Array> {
        let logits = match (&self.lm_head, self.embed.as_linear(h)) {
            (Some(head), _) => head.forward(h)?,
            (None, Some(tied)) => tied?,
            (None, None) => unreachable!("an untied model has an lm_head"),
        };
        match self.config.final_logit_softcapping {
            Some(cap) => gemma::soft_cap(&logits, cap),
            None => Ok(logits),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut all = self.embed.arrays();
        for block in &self.blocks {
            all.extend(block.arrays());
        }
        all.push(&self.norm);
        if let Some(head) = &self.lm_head {
            all.extend(head.arrays());
        }
        for layer in &self.mtp {
            all.extend(layer.arrays());
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_goes_in_pieces_only_where_mlx_cuda_block_would_be_too_deep() {
        let gpu = || true;
        // Heads of 64 or more (32 pairs): one call, whatever the rows.
        assert_eq!(rope_rows_per_call(32, 8, 1, 4096, gpu), 4096);
        // 8 pairs at one position: one call under 128 (rows x ceil(heads /
        // 4)), pieces from there.
        assert_eq!(rope_rows_per_call(8, 8, 1, 63, gpu), 63);
        assert_eq!(rope_rows_per_call(8, 8, 1, 64, gpu), 63);
        assert_eq!(rope_rows_per_call(8, 2, 1, 200, gpu), 127);
        assert_eq!(rope_rows_per_call(15, 16, 1, 40, gpu), 31);
        // Positions take doublings too: 8 pairs at 2 positions fit; 4 pairs
        // at 3 do not.
        assert_eq!(rope_rows_per_call(8, 8, 2, 64, gpu), 64);
        assert_eq!(rope_rows_per_call(4, 8, 3, 64, gpu), 63);
        // The CPU's fallback has no such limit.
        assert_eq!(rope_rows_per_call(8, 8, 1, 64, || false), 64);
    }

    #[test]
    fn rope_in_pieces_equals_rope_at_once() {
        let rope = Rope {
            dims: 16,
            traditional: false,
            base: Some(10_000.0),
            scale: 1.0,
            freqs: None,
            input_scale: None,
        };
        let x = mlx_rs::random::normal::<f32>(&[70, 8, 1, 16], None, None, None).unwrap();
        let positions = Array::from_slice(&(0..70).map(|i| i * 3 + 1).collect::<Vec<i32>>(), &[70]);
        let whole = rope.apply_at_in_pieces(&x, &positions, 70).unwrap();
        let pieces = rope.apply_at_in_pieces(&x, &positions, 31).unwrap();
        assert_eq!(pieces.shape(), whole.shape());
        assert!(
            pieces.eq_values(&whole).unwrap(),
            "RoPE in pieces differs from RoPE at once"
        );
        // At one offset for every entry (prompt chunks side by side).
        let at_offset = |x: &Array, _| rope.apply(x, 5);
        let whole = in_pieces(&x, 70, at_offset).unwrap();
        let pieces = in_pieces(&x, 31, at_offset).unwrap();
        assert!(pieces.eq_values(&whole).unwrap());
    }
}
