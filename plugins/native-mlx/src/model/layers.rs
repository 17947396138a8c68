//! Linear and embedding layers, dense or MLX-quantized, computed exactly as `mlx.nn` computes them.
//!
//! On the CPU two choices make the same numbers faster: dense weights are
//! stored as contiguous `W.T`, which MLX's CPU BLAS multiplies 25-30 %
//! faster than the transposed view `mlx.nn.Linear` uses; and large products
//! are split over several MLX streams (MLX runs one CPU thread per stream
//! and has no intra-op threading) — by output rows of the matrix when
//! decoding one token, by tokens when prefilling many. Every output element
//! is still the same dot product in the same order, so results stay
//! bit-identical to mlx-lm's.

use mlx_rs::ops::{addmm, concatenate, dequantize, matmul, quantized_matmul};
use mlx_rs::transforms::eval;
use mlx_rs::{with_stream, Array};

use crate::config::{QuantMode, QuantParams, Quantization};
use crate::error::{Error, Result};
use crate::ffi::{Packed, SendStream};
use crate::indexing::IndexOnStream;
use crate::model::weights::Weights;

/// Where independent parts of one product run: the default stream and a
/// few extra CPU streams (one thread each).
#[derive(Clone)]
pub(crate) struct Parallel {
    /// Part `i > 0` runs on `streams[i - 1]`, part 0 on the default stream.
    streams: Vec<SendStream>,
    /// Products smaller than this (multiply-adds) are not split: below it
    /// the cost of the extra ops outweighs the parallelism.
    min_work: usize,
}

impl Parallel {
    /// `threads` parts at most (one stream per extra thread), for products of
    /// at least `min_work` multiply-adds.
    pub(crate) fn cpu(threads: usize, min_work: usize) -> Result<Self> {
        Ok(Self {
            streams: (1..threads)
                .map(|_| SendStream::new(true))
                .collect::<Result<_>>()?,
            min_work,
        })
    }

    /// Everything on the default stream.
    pub(crate) fn none() -> Self {
        Self {
            streams: Vec::new(),
            min_work: usize::MAX,
        }
    }

    /// Into how many parts to split `items` independent pieces of work
    /// totalling `work` multiply-adds (1: do not split).
    pub(crate) fn parts(&self, items: usize, work: usize) -> usize {
        if work < self.min_work {
            return 1;
        }
        (self.streams.len() + 1).min(items).max(1)
    }

    /// Runs `f` with part `i`'s stream as the default stream.
    pub(crate) fn on<T>(&self, i: usize, f: impl FnOnce() -> T) -> T {
        match i.checked_sub(1) {
            Some(s) => with_stream(&self.streams[s].0, f),
            None => f(),
        }
    }

    /// The `(start, end)` bounds of part `i` of `parts` over `n` items.
    pub(crate) fn bounds(n: i32, parts: usize, i: usize) -> (i32, i32) {
        let (parts, i) = (parts as i32, i as i32);
        (n * i / parts, n * (i + 1) / parts)
    }
}

/// How weight matrices are stored and split for the device they run on.
pub(crate) struct Layout {
    /// Store dense weights as contiguous `W.T`.
    pub(crate) pretranspose: bool,
    /// Where the parts of a split product run.
    pub(crate) parallel: Parallel,
    /// Quantized products of a few rows run on `crate::qmv`'s kernel.
    pub(crate) custom_qmv: bool,
    /// Sorted quantized expert products run on `crate::qmv::gather_qmv`.
    pub(crate) custom_gather_qmv: bool,
    /// Dense products add their bias or residual as the number of rows
    /// makes cheapest on a GPU (see [`Sums`]).
    pub(crate) sums_by_rows: bool,
}

/// Where a dense product's bias, and the residual after it, are added.
///
/// MLX's CUDA backend multiplies one row by its own `gemv` kernel, one
/// kernel node to encode; a product with a sum in it (AddMM), or of more
/// rows, goes to cuBLAS, which MLX records by capturing the stream into a
/// graph of its own and adding that as a child node, dearer to encode than
/// a kernel. A decoding step's cost on the host is in encoding its nodes,
/// so at one row a sum is cheapest as a product and an Add; at more rows,
/// where cuBLAS runs anyway, inside the product (its epilogue, or its `C`),
/// which saves the Add.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sums {
    /// As `nn.Linear`: a bias in the product, a residual added after it.
    Linear,
    /// In the product for more than one row, after it for one.
    ByRows,
}

/// One block of output rows of a weight matrix `(out, in)`.
#[derive(Clone)]
enum Matrix {
    /// Dense: the right operand of `x @ rhs`, `W.T` as a strided view or a
    /// contiguous copy (see [`Layout::pretranspose`]), and the same memory
    /// as `(1, in, out)`, `batched`. MLX multiplies a `(1, n, in)` `x` by a
    /// 2-D matrix as `(n, in)`, through a Flatten and an Unflatten (an
    /// AddMM through two Reshapes) that each cost the host an op to encode
    /// on every step; by `batched` it is one product of a batch of one, the
    /// same kernel with the same numbers and no reshapes: 6 to 8 ops fewer
    /// a layer of a dense model.
    Dense { rhs: Array, batched: Array },
    /// Packed `uint32` weights with one scale (and, affine, one bias) per group.
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        params: QuantParams,
        /// Products of a few rows run on `crate::qmv`'s kernel where it fits.
        custom_qmv: bool,
    },
}

/// The right operand of a dense product of `x`: `batched` for `(1, n, in)`.
fn dense_rhs<'a>(x: &Array, rhs: &'a Array, batched: &'a Array) -> &'a Array {
    if x.ndim() == 3 && x.dim(0) == 1 {
        batched
    } else {
        rhs
    }
}

impl Matrix {
    /// `x @ W.T`, plus `bias` the way `nn.Linear` / `nn.QuantizedLinear` add
    /// it, or as `sums` says for a dense matrix.
    fn apply(&self, x: &Array, bias: Option<&Array>, sums: Sums) -> Result<Array> {
        Ok(match (self, bias) {
            // nn.Linear fuses the bias into the GEMM (beta * bias), which
            // rounds differently from adding it afterwards.
            (Self::Dense { rhs, batched }, bias) => {
                let rhs = dense_rhs(x, rhs, batched);
                match bias {
                    Some(bias) if sums == Sums::ByRows && x.dim(-2) == 1 => {
                        matmul(x, rhs)?.add(bias)?
                    }
                    Some(bias) => addmm(bias, x, rhs, None, None)?,
                    None => matmul(x, rhs)?,
                }
            }
            (
                Self::Quantized {
                    weight,
                    scales,
                    biases,
                    params,
                    custom_qmv,
                },
                bias,
            ) => {
                let y = match (params.mode, biases) {
                    (_, Some(biases))
                        if *custom_qmv && crate::qmv::fits(x, weight, scales, params) =>
                    {
                        crate::qmv::qmv(x, weight, scales, biases, params)?
                    }
                    _ => match params.mode {
                        QuantMode::Affine => quantized_matmul(
                            x,
                            weight,
                            scales,
                            biases.as_ref(),
                            true,
                            params.group_size,
                            params.bits,
                        )?,
                        _ => Packed {
                            weight,
                            scales,
                            biases: biases.as_ref(),
                            params: *params,
                        }
                        .matmul(x)?,
                    },
                };
                match bias {
                    Some(bias) => y.add(bias)?,
                    None => y,
                }
            }
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            Self::Dense { rhs, .. } => vec![rhs],
            Self::Quantized {
                weight,
                scales,
                biases,
                ..
            } => [weight, scales].into_iter().chain(biases).collect(),
        }
    }
}

/// A block of output rows with its bias rows.
#[derive(Clone)]
struct Shard {
    matrix: Matrix,
    bias: Option<Bias>,
    sums: Sums,
}

impl Shard {
    fn apply(&self, x: &Array) -> Result<Array> {
        self.matrix
            .apply(x, self.bias.as_ref().map(|b| b.for_input(x)), self.sums)
    }
}

/// A bias `(out,)`, and the same memory as `(1, 1, out)`: the shape of one
/// token's output, which an AddMM or an Add then takes without a Broadcast
/// op (a decoding step's, every layer).
#[derive(Clone)]
struct Bias {
    row: Array,
    one_token: Array,
}

impl Bias {
    fn new(row: Array) -> Result<Self> {
        let one_token = row.reshape(&[1, 1, -1])?;
        eval([&row, &one_token])?;
        Ok(Self { row, one_token })
    }

    /// The bias for the products of `x`.
    fn for_input(&self, x: &Array) -> &Array {
        if x.shape().len() == 3 && x.dim(0) == 1 && x.dim(1) == 1 {
            &self.one_token
        } else {
            &self.row
        }
    }
}

/// A weight matrix as a linear map whose products are spread over the CPU
/// streams of the layout: decoding (one token) splits the matrix into row
/// blocks, prefill (many tokens) splits the tokens.
#[derive(Clone)]
struct Sharded {
    /// Row block `i` runs on part `i`'s stream.
    shards: Vec<Shard>,
    parallel: Parallel,
    /// Weights of the whole matrix (`out * in`).
    weights: usize,
}

impl Sharded {
    /// Splits `weight` (dense `(out, in)`, or packed with `quantized` scales
    /// and biases) and `bias` by output rows as `layout` says.
    fn new(
        weight: &Array,
        quantized: Option<(&Array, Option<&Array>, QuantParams)>,
        bias: Option<&Array>,
        layout: &Layout,
        pretranspose: bool,
    ) -> Result<Self> {
        let (rows, cols) = (weight.dim(0), weight.dim(-1));
        let cols = match quantized {
            Some((_, _, p)) => cols * 32 / p.bits,
            None => cols,
        };
        let weights = rows as usize * cols as usize;
        let parallel = &layout.parallel;
        // Row blocks serve decoding, where one token multiplies the matrix.
        let blocks = parallel.parts(rows as usize, weights);
        let mut shards = Vec::new();
        for i in 0..blocks {
            let (start, end) = Parallel::bounds(rows, blocks, i);
            let whole = blocks == 1;
            let rows_of = |a: &Array| -> Result<Array> {
                Ok(if whole { a.clone() } else { a.at(start..end)? })
            };
            let matrix = match quantized {
                None => {
                    let rhs = rows_of(weight)?.transpose()?;
                    let rhs = if pretranspose { rhs.contiguous()? } else { rhs };
                    let batched = rhs.expand_dims(0)?;
                    Matrix::Dense { rhs, batched }
                }
                Some((scales, biases, params)) => Matrix::Quantized {
                    weight: rows_of(weight)?,
                    scales: rows_of(scales)?,
                    biases: biases.map(rows_of).transpose()?,
                    params,
                    custom_qmv: layout.custom_qmv,
                },
            };
            let shard = Shard {
                matrix,
                bias: bias.map(|b| Bias::new(rows_of(b)?)).transpose()?,
                sums: if layout.sums_by_rows {
                    Sums::ByRows
                } else {
                    Sums::Linear
                },
            };
            // Evaluate now, so that an original dense matrix can be freed as
            // soon as its transposed copy exists (peak memory at load).
            eval(shard.matrix.arrays())?;
            if let Matrix::Dense { batched, .. } = &shard.matrix {
                eval([batched])?;
            }
            shards.push(shard);
        }
        Ok(Self {
            shards,
            parallel: parallel.clone(),
            weights,
        })
    }

    /// `x @ W.T (+ bias)` for `x` of shape `(batch, tokens, in)`.
    fn apply(&self, x: &Array) -> Result<Array> {
        let tokens = x.dim(-2);
        let parts = self
            .parallel
            .parts(tokens as usize, tokens as usize * self.weights);
        if parts > 1 {
            // Prefill: each block of tokens is an independent product on its
            // own stream, with every row block of the matrix.
            let blocks = (0..parts)
                .map(|i| {
                    let (start, end) = Parallel::bounds(tokens, parts, i);
                    let rows = x.at((.., start..end))?;
                    self.parallel.on(i, || self.row_blocks(&rows, false))
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(concatenate(&blocks, -2)?);
        }
        self.row_blocks(x, true)
    }

    /// `residual + x @ W.T (+ bias)`: in one AddMM for a dense matrix of
    /// one block without a bias where [`Sums::ByRows`] puts the sum in the
    /// product (more than one row), else the product and an Add.
    fn apply_plus(&self, x: &Array, residual: &Array) -> Result<Array> {
        if let [Shard {
            matrix: Matrix::Dense { rhs, batched },
            bias: None,
            sums: Sums::ByRows,
        }] = self.shards.as_slice()
        {
            if x.dim(-2) > 1 {
                return Ok(addmm(residual, x, dense_rhs(x, rhs, batched), None, None)?);
            }
        }
        Ok(residual.add(self.apply(x)?)?)
    }

    /// The product with every row block, concatenated; `spread` runs block
    /// `i` on part `i`'s stream, else all on the current stream.
    fn row_blocks(&self, x: &Array, spread: bool) -> Result<Array> {
        if let [only] = self.shards.as_slice() {
            return only.apply(x);
        }
        let parts = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let apply = || shard.apply(x);
                if spread {
                    self.parallel.on(i, apply)
                } else {
                    apply()
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(concatenate(&parts, -1)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.matrix
                    .arrays()
                    .into_iter()
                    .chain(s.bias.iter().map(|b| &b.row))
            })
            .collect()
    }
}

/// The quantization parameters of the module at `prefix`, if its weights
/// are quantized: exactly when its scales exist, as in mlx-lm.
pub(crate) fn quantization_of(
    weights: &Weights,
    prefix: &str,
    quantization: Option<&Quantization>,
) -> Result<Option<QuantParams>> {
    if !weights.contains(&format!("{prefix}.scales")) {
        return Ok(None);
    }
    quantization
        .and_then(|q| q.for_module(prefix))
        .map(Some)
        .ok_or_else(|| Error::Weights {
            dir: weights.dir().to_owned(),
            what: format!("'{prefix}' is quantized but config.json has no quantization for it"),
        })
}

/// The per-group biases of the quantized module at `prefix`: affine mode
/// has them, the float modes do not.
pub(crate) fn take_biases(
    weights: &mut Weights,
    prefix: &str,
    params: QuantParams,
) -> Result<Option<Array>> {
    match params.mode {
        QuantMode::Affine => Ok(Some(weights.take(&format!("{prefix}.biases"))?)),
        QuantMode::Mxfp4 => Ok(None),
    }
}

/// A linear layer: a matrix and an optional bias.
#[derive(Clone)]
pub(crate) struct Linear(Sharded);

impl Linear {
    /// Takes the layer at `prefix`; `bias` says whether the architecture has one.
    pub(crate) fn take(
        weights: &mut Weights,
        prefix: &str,
        bias: bool,
        quantization: Option<&Quantization>,
        layout: &Layout,
    ) -> Result<Self> {
        let params = quantization_of(weights, prefix, quantization)?;
        let weight = weights.take(&format!("{prefix}.weight"))?;
        let bias = if bias {
            Some(weights.take(&format!("{prefix}.bias"))?)
        } else {
            None
        };
        let sharded = match params {
            None => Sharded::new(&weight, None, bias.as_ref(), layout, layout.pretranspose)?,
            Some(params) => {
                let scales = weights.take(&format!("{prefix}.scales"))?;
                let biases = take_biases(weights, prefix, params)?;
                Sharded::new(
                    &weight,
                    Some((&scales, biases.as_ref(), params)),
                    bias.as_ref(),
                    layout,
                    false,
                )?
            }
        };
        Ok(Self(sharded))
    }

    /// Applies the layer to `x` of shape `(..., in)`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        self.0.apply(x)
    }

    /// `residual + forward(x)`, or just `forward(x)` without a residual;
    /// the sum inside the product where [`Layout::sums_by_rows`] says so.
    pub(crate) fn forward_plus(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        match residual {
            Some(residual) => self.0.apply_plus(x, residual),
            None => self.0.apply(x),
        }
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        self.0.arrays()
    }
}

/// Linear layers that read the same input (queries, keys and values; gate
/// and up projections), as separate products or fused into one.
///
/// Fused, their weights are stacked by output rows into one matrix, and one
/// product replaces several: on a GPU a decoding step is bound by the number
/// of kernels (and their encoding on the host), not by the bytes of the
/// weights. Every output is still its own row's dot product with the input,
/// but the product of a taller matrix may be computed by other kernels,
/// which may round differently from mlx-lm's separate layers.
#[derive(Clone)]
pub(crate) enum Projections {
    /// One layer per output.
    Separate(Vec<Linear>),
    /// One layer whose output columns are the outputs, split at `ends`.
    Fused { linear: Linear, ends: Vec<i32> },
}

impl Projections {
    /// Takes the layers at `prefixes`, fused when `fuse` is set and they are
    /// alike (all dense, or all quantized with the same parameters).
    pub(crate) fn take(
        weights: &mut Weights,
        prefixes: &[String],
        bias: bool,
        quantization: Option<&Quantization>,
        layout: &Layout,
        fuse: bool,
    ) -> Result<Self> {
        let params = prefixes
            .iter()
            .map(|p| quantization_of(weights, p, quantization))
            .collect::<Result<Vec<_>>>()?;
        if !fuse || params.windows(2).any(|w| w[0] != w[1]) {
            return Ok(Self::Separate(
                prefixes
                    .iter()
                    .map(|p| Linear::take(weights, p, bias, quantization, layout))
                    .collect::<Result<_>>()?,
            ));
        }
        let mut parts = |suffix: &str| -> Result<Vec<Array>> {
            prefixes
                .iter()
                .map(|p| weights.take(&format!("{p}.{suffix}")))
                .collect()
        };
        let weight_parts = parts("weight")?;
        // The split points: where each layer's output columns end (but the last).
        let ends = weight_parts
            .iter()
            .scan(0, |end, w| {
                *end += w.dim(0);
                Some(*end)
            })
            .take(prefixes.len() - 1)
            .collect();
        let weight = concatenate(&weight_parts, 0)?;
        let bias = if bias {
            Some(concatenate(&parts("bias")?, 0)?)
        } else {
            None
        };
        let sharded = match params[0] {
            None => Sharded::new(&weight, None, bias.as_ref(), layout, layout.pretranspose)?,
            Some(params) => {
                let scales = concatenate(&parts("scales")?, 0)?;
                let biases = match params.mode {
                    QuantMode::Affine => Some(concatenate(&parts("biases")?, 0)?),
                    QuantMode::Mxfp4 => None,
                };
                Sharded::new(
                    &weight,
                    Some((&scales, biases.as_ref(), params)),
                    bias.as_ref(),
                    layout,
                    false,
                )?
            }
        };
        Ok(Self::Fused {
            linear: Linear(sharded),
            ends,
        })
    }

    /// Takes one layer at `prefix` whose checkpoint already fuses several
    /// outputs (Phi-3's `qkv_proj` and `gate_up_proj`); its output columns
    /// are split at `ends`, as the model's own code splits them.
    pub(crate) fn take_fused(
        weights: &mut Weights,
        prefix: &str,
        ends: Vec<i32>,
        quantization: Option<&Quantization>,
        layout: &Layout,
    ) -> Result<Self> {
        Ok(Self::Fused {
            linear: Linear::take(weights, prefix, false, quantization, layout)?,
            ends,
        })
    }

    /// Applies every layer to `x`; one output per layer, in order.
    pub(crate) fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Self::Separate(layers) => layers.iter().map(|l| l.forward(x)).collect(),
            Self::Fused { linear, ends } => Ok(linear.forward(x)?.split_at_indices(ends, -1)?),
        }
    }

    /// The one layer of fused projections, whose output holds every
    /// layer's output side by side; `None` when they are separate.
    pub(crate) fn joined(&self) -> Option<&Linear> {
        match self {
            Self::Separate(_) => None,
            Self::Fused { linear, .. } => Some(linear),
        }
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        match self {
            Self::Separate(layers) => layers.iter().flat_map(Linear::arrays).collect(),
            Self::Fused { linear, .. } => linear.arrays(),
        }
    }
}

/// The token embedding table; with tied weights also the output projection.
#[derive(Clone)]
pub(crate) struct Embedding {
    /// The table `(vocab, hidden)`, dense or packed.
    table: Table,
    /// The table as a linear map, when the output projection is tied to it.
    output: Option<Sharded>,
}

#[derive(Clone)]
enum Table {
    Dense(Array),
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        params: QuantParams,
    },
}

impl Embedding {
    /// Takes the table at `prefix`; `tied` also prepares it as the output
    /// projection (without a transposed copy: that would double the
    /// largest matrix of small models).
    pub(crate) fn take(
        weights: &mut Weights,
        prefix: &str,
        quantization: Option<&Quantization>,
        tied: bool,
        layout: &Layout,
    ) -> Result<Self> {
        let params = quantization_of(weights, prefix, quantization)?;
        let weight = weights.take(&format!("{prefix}.weight"))?;
        let table = match params {
            None => Table::Dense(weight),
            Some(params) => Table::Quantized {
                weight,
                scales: weights.take(&format!("{prefix}.scales"))?,
                biases: take_biases(weights, prefix, params)?,
                params,
            },
        };
        let output = match (&table, tied) {
            (_, false) => None,
            (Table::Dense(weight), true) => Some(Sharded::new(weight, None, None, layout, false)?),
            (
                Table::Quantized {
                    weight,
                    scales,
                    biases,
                    params,
                },
                true,
            ) => Some(Sharded::new(
                weight,
                Some((scales, biases.as_ref(), *params)),
                None,
                layout,
                false,
            )?),
        };
        Ok(Self { table, output })
    }

    /// Looks up the rows of `ids`; quantized tables dequantize only the
    /// gathered rows.
    pub(crate) fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.table {
            Table::Dense(weight) => weight.take_axis(ids, 0)?,
            Table::Quantized {
                weight,
                scales,
                biases,
                params,
            } => {
                let biases = biases.as_ref().map(|b| b.take_axis(ids, 0)).transpose()?;
                let (weight, scales) = (weight.take_axis(ids, 0)?, scales.take_axis(ids, 0)?);
                match params.mode {
                    QuantMode::Affine => dequantize(
                        weight,
                        scales,
                        biases.as_ref(),
                        params.group_size,
                        params.bits,
                    )?,
                    _ => Packed {
                        weight: &weight,
                        scales: &scales,
                        biases: biases.as_ref(),
                        params: *params,
                    }
                    .dequantize()?,
                }
            }
        })
    }

    /// `x @ table.T`, for models whose output projection is tied to the
    /// embedding; `None` when it is not.
    pub(crate) fn as_linear(&self, x: &Array) -> Option<Result<Array>> {
        self.output.as_ref().map(|output| output.apply(x))
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        match &self.table {
            Table::Dense(weight) => vec![weight],
            Table::Quantized {
                weight,
                scales,
                biases,
                ..
            } => [weight, scales].into_iter().chain(biases).collect(),
        }
    }
}

/// A LayerNorm's weight and bias (`mlx.nn.LayerNorm` over the last axis),
/// as the encoders and the vision tower load them.
pub(crate) struct LayerNorm {
    pub(crate) weight: Array,
    pub(crate) bias: Array,
}

impl LayerNorm {
    /// Takes `{prefix}.weight` and `{prefix}.bias`.
    pub(crate) fn take(w: &mut Weights, prefix: &str) -> Result<Self> {
        Ok(Self {
            weight: w.take(&format!("{prefix}.weight"))?,
            bias: w.take(&format!("{prefix}.bias"))?,
        })
    }

    /// The norm of `x` with `eps`.
    pub(crate) fn apply(&self, x: &Array, eps: f32) -> Result<Array> {
        Ok(mlx_rs::fast::layer_norm(x, &self.weight, &self.bias, eps)?)
    }
}
