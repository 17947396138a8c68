//! Mixture-of-experts MLP blocks: a router picks each token's experts, whose MLPs run as gathered products (mlx-lm's `SwitchGLU`).
//!
//! The experts' weights are stacked, `(experts, out, in)` per projection,
//! and each projection of every token's `k` experts is one `gather_mm` (or,
//! quantized, one `gather_qmm`) over the whole step: never a loop over
//! experts. A token's result depends on that token alone, so a packed step's
//! decoding rows and prompt chunks share the three products of a layer, and
//! a row's numbers are those it gets alone. The ops are mlx-lm's, in its
//! order (router softmax, `argpartition`, the sort of many tokens by expert,
//! the weighted sum), so greedy ids match mlx-lm's on the CPU.

use mlx_rs::ops::indexing::{Ellipsis, IntoStrideBy};
use mlx_rs::ops::{
    argpartition_axis, argsort_axis, gather_mm, gather_qmm, softmax_axis, stack, unflatten,
};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use crate::config::{
    ExpertActivation, Family, MoeConfig, QuantMode, QuantParams, Quantization, Routing,
};
use crate::error::{Error, Result};
use crate::ffi::Packed;
use crate::indexing::IndexOnStream;
use crate::model::layers::{quantization_of, take_biases, Layout, Linear};
use crate::model::weights::Weights;
use crate::model::{swiglu, swiglu_clamped};

/// mlx-lm's `SwitchGLU` sorts the tokens by expert from this many
/// (token, expert) pairs on, so each expert's weights are read in one run.
const SORT_FROM: usize = 64;

/// One projection of every expert.
#[derive(Clone)]
enum SwitchMatrix {
    /// The stacked weights transposed, `(experts, in, out)`: the view
    /// mlx-lm's `SwitchLinear` hands to `gather_mm`.
    Dense(Array),
    /// Packed `(experts, out, in * bits / 32)` weights, multiplied
    /// transposed by `gather_qmm` as `QuantizedSwitchLinear` does (MXFP4
    /// has no biases).
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        params: QuantParams,
    },
}

/// A projection of every expert, applied to each token with the experts
/// the router chose for it.
#[derive(Clone)]
struct SwitchLinear {
    matrix: SwitchMatrix,
    /// `(experts, out)`, when the architecture has biases.
    bias: Option<Array>,
    /// Sorted affine products run on `crate::qmv::gather_qmv` where it fits
    /// (`Layout::custom_gather_qmv`).
    custom_gather: bool,
}

impl SwitchLinear {
    /// Takes the stacked projection at `prefix` (`{prefix}.weight`, dense or
    /// MLX-quantized). Without it, stacks the dense `{expert(e)}.weight` of
    /// each of `num_experts` experts (Hugging Face's layout), as mlx-lm's
    /// `sanitize` does at load.
    /// `bias`: the architecture has `{prefix}.bias`, `(experts, out)`.
    fn take(
        weights: &mut Weights,
        prefix: &str,
        expert: impl Fn(i32) -> String,
        num_experts: i32,
        bias: bool,
        quantization: Option<&Quantization>,
    ) -> Result<Self> {
        let stacked = format!("{prefix}.weight");
        let matrix =
            if !weights.contains(&stacked) && weights.contains(&format!("{}.weight", expert(0))) {
                let each = (0..num_experts)
                    .map(|e| weights.take(&format!("{}.weight", expert(e))))
                    .collect::<Result<Vec<_>>>()?;
                let weight = stack(&each, 0)?;
                // Now, so each expert's own array is freed before the next
                // layer's are read (peak memory at load).
                eval([&weight])?;
                SwitchMatrix::Dense(weight.swap_axes(-1, -2)?)
            } else {
                match quantization_of(weights, prefix, quantization)? {
                    None => SwitchMatrix::Dense(weights.take(&stacked)?.swap_axes(-1, -2)?),
                    Some(params) => SwitchMatrix::Quantized {
                        weight: weights.take(&stacked)?,
                        scales: weights.take(&format!("{prefix}.scales"))?,
                        biases: take_biases(weights, prefix, params)?,
                        params,
                    },
                }
            };
        let bias = if bias {
            Some(weights.take(&format!("{prefix}.bias"))?)
        } else {
            None
        };
        Ok(Self {
            matrix,
            bias,
            custom_gather: false,
        })
    }

    /// Refuses dense experts that MLX cannot multiply on the CPU: its CPU
    /// `gather_mm` takes float32 alone, and any other dtype failed at the
    /// first token (mlx-lm's own run fails the same way).
    fn check_cpu(&self, weights: &Weights, prefix: &str) -> Result<()> {
        match &self.matrix {
            SwitchMatrix::Dense(rhs) if rhs.dtype() != Dtype::Float32 => Err(Error::Weights {
                dir: weights.dir().to_owned(),
                what: format!(
                    "the experts '{prefix}' are {}, and MLX multiplies experts on the CPU in \
                     float32 only; on the CPU use a float32 or a quantized checkpoint \
                     (mlx_lm.convert -q)",
                    // "bfloat16", "float16": the names config.json uses.
                    format!("{:?}", rhs.dtype()).to_lowercase()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// `x @ W[e].T` for each expert `e` of `indices`: `x` is `(..., 1, 1,
    /// in)` with `indices` `(..., k)` (or, sorted, `(m, 1, in)` with `(m,)`),
    /// the result `(..., k, 1, out)` (`(m, 1, out)`).
    fn apply(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let y = match &self.matrix {
            SwitchMatrix::Dense(rhs) => gather_mm(x, rhs, None, indices, sorted)?,
            SwitchMatrix::Quantized {
                weight,
                scales,
                biases,
                params,
            } => match params.mode {
                QuantMode::Affine => match biases {
                    Some(biases)
                        if sorted
                            && self.custom_gather
                            && crate::qmv::gather_fits(x, weight, scales, indices, params)
                            && crate::qmv::gather_pays(x, weight, params) =>
                    {
                        crate::qmv::gather_qmv(x, weight, scales, biases, indices, params)?
                    }
                    _ => gather_qmm(
                        x,
                        weight,
                        scales,
                        biases.as_ref(),
                        None,
                        indices,
                        true,
                        params.group_size,
                        params.bits,
                        sorted,
                    )?,
                },
                _ => Packed {
                    weight,
                    scales,
                    biases: biases.as_ref(),
                    params: *params,
                }
                .gather_matmul(x, indices, sorted)?,
            },
        };
        Ok(match &self.bias {
            Some(bias) => y.add(bias.take_axis(indices, 0)?.expand_dims(-2)?)?,
            None => y,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let matrix = match &self.matrix {
            SwitchMatrix::Dense(rhs) => vec![rhs],
            SwitchMatrix::Quantized {
                weight,
                scales,
                biases,
                ..
            } => [weight, scales].into_iter().chain(biases).collect(),
        };
        matrix.into_iter().chain(&self.bias).collect()
    }
}

/// gpt-oss's experts at `prefix` as OpenAI released them, made into the
/// gate, up and down projections mlx-lm's `sanitize` makes of them: MXFP4
/// `_blocks` (16 bytes per 32 weights) read as packed `uint32` words,
/// `_scales`, and `gate_up_proj`'s rows (and bias) split into the even ones
/// (gate) and the odd ones (up).
fn openai_experts(
    weights: &mut Weights,
    prefix: &str,
    quantization: Option<&Quantization>,
) -> Result<[SwitchLinear; 3]> {
    let params = quantization
        .map(|q| q.default)
        .filter(|p| p.mode == QuantMode::Mxfp4)
        .ok_or_else(|| Error::Weights {
            dir: weights.dir().to_owned(),
            what: format!(
                "'{prefix}' holds MXFP4 blocks but config.json declares no mxfp4 quantization"
            ),
        })?;
    let mut take = |name: &str| weights.take(&format!("{prefix}.{name}"));
    let packed = |blocks: Array| -> Result<Array> { Ok(blocks.view::<u32>()?.flatten(-2, None)?) };
    let (gate_up, gate_up_scales, gate_up_bias) = (
        packed(take("gate_up_proj_blocks")?)?,
        take("gate_up_proj_scales")?,
        take("gate_up_proj_bias")?,
    );
    let (down, down_scales, down_bias) = (
        packed(take("down_proj_blocks")?)?,
        take("down_proj_scales")?,
        take("down_proj_bias")?,
    );
    let rows = |a: &Array, first: i32| -> Result<Array> {
        let half = a.at((.., (first..).stride_by(2)))?.contiguous()?;
        eval([&half])?;
        Ok(half)
    };
    let linear = |weight: Array, scales: Array, bias: Array| SwitchLinear {
        matrix: SwitchMatrix::Quantized {
            weight,
            scales,
            biases: None,
            params,
        },
        bias: Some(bias),
        custom_gather: false,
    };
    Ok([
        linear(
            rows(&gate_up, 0)?,
            rows(&gate_up_scales, 0)?,
            rows(&gate_up_bias, 0)?,
        ),
        linear(
            rows(&gate_up, 1)?,
            rows(&gate_up_scales, 1)?,
            rows(&gate_up_bias, 1)?,
        ),
        linear(down, down_scales, down_bias),
    ])
}

/// The experts' SwiGLU MLPs (mlx-lm's `SwitchGLU`).
#[derive(Clone)]
struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    activation: ExpertActivation,
}

impl SwitchGlu {
    /// The MLP of each token's chosen experts: `x` `(..., in)`, `indices`
    /// `(..., k)`; returns `(..., k, in)`, expert by expert.
    fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        // Many tokens: sorted by expert, as mlx-lm does (`_gather_sort`),
        // then put back in order (`_scatter_unsort`).
        let sort = indices.size() >= SORT_FROM;
        let (x, idx, inverse) = if sort {
            let k = indices.dim(-1);
            let flat = indices.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inverse = argsort_axis(&order, 0)?;
            let tokens = order.floor_divide(Array::from_slice(&[k as u32], &[]))?;
            let x = x.flatten(0, -3)?.take_axis(&tokens, 0)?;
            (x, flat.take_axis(&order, 0)?, Some(inverse))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.apply(&x, &idx, sort)?;
        let gate = self.gate_proj.apply(&x, &idx, sort)?;
        let hidden = match self.activation {
            ExpertActivation::Swiglu => swiglu(&gate, &up)?,
            ExpertActivation::SwigluClamped { alpha, limit } => {
                swiglu_clamped(&gate, &up, alpha, limit)?
            }
        };
        let y = self.down_proj.apply(&hidden, &idx, sort)?;
        let y = match inverse {
            Some(inverse) => unflatten(y.take_axis(&inverse, 0)?, 0, indices.shape())?,
            None => y,
        };
        Ok(y.squeeze_axes(&[-2])?)
    }

    fn arrays(&self) -> Vec<&Array> {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(SwitchLinear::arrays)
            .collect()
    }
}

/// A sparse MLP block: the router and the experts (Qwen3-MoE's
/// `Qwen3MoeSparseMoeBlock`, gpt-oss's `MLPBlock`).
#[derive(Clone)]
pub(crate) struct SparseMoe {
    /// Expert logits of each token, `(hidden) -> (experts)`.
    router: Linear,
    experts: SwitchGlu,
    top_k: i32,
    routing: Routing,
}

impl SparseMoe {
    /// Takes the block at `prefix` (`model.layers.N.mlp`). Qwen3-MoE: the
    /// router at `gate`, the experts stacked at
    /// `switch_mlp.{gate,up,down}_proj` (as mlx-lm writes them) or one by
    /// one at `experts.E.*` (Hugging Face). gpt-oss: the router at `router`,
    /// the experts stacked at `experts.{gate,up,down}_proj`, as mlx-lm's
    /// `sanitize` leaves them. `on_cpu`: the model runs on the CPU, whose
    /// `gather_mm` multiplies float32 alone.
    pub(crate) fn take(
        weights: &mut Weights,
        prefix: &str,
        family: Family,
        moe: &MoeConfig,
        quantization: Option<&Quantization>,
        layout: &Layout,
        on_cpu: bool,
    ) -> Result<Self> {
        let (router, stacked) = match family {
            Family::GptOss => ("router", "experts"),
            _ => ("gate", "switch_mlp"),
        };
        let router = Linear::take(
            weights,
            &format!("{prefix}.{router}"),
            moe.bias,
            quantization,
            layout,
        )?;
        let openai = format!("{prefix}.experts.gate_up_proj_blocks");
        let [gate_proj, up_proj, down_proj] =
            if family == Family::GptOss && weights.contains(&openai) {
                openai_experts(weights, &format!("{prefix}.experts"), quantization)?
            } else {
                let mut projection = |name: &str| {
                    SwitchLinear::take(
                        weights,
                        &format!("{prefix}.{stacked}.{name}"),
                        |e| format!("{prefix}.experts.{e}.{name}"),
                        moe.num_experts,
                        moe.bias,
                        quantization,
                    )
                };
                [
                    projection("gate_proj")?,
                    projection("up_proj")?,
                    projection("down_proj")?,
                ]
            };
        let mut experts = SwitchGlu {
            gate_proj,
            up_proj,
            down_proj,
            activation: moe.activation,
        };
        for projection in [
            &mut experts.gate_proj,
            &mut experts.up_proj,
            &mut experts.down_proj,
        ] {
            projection.custom_gather = layout.custom_gather_qmv;
        }
        if on_cpu {
            experts
                .gate_proj
                .check_cpu(weights, &format!("{prefix}.{stacked}"))?;
        }
        Ok(Self {
            router,
            experts,
            top_k: moe.experts_per_token,
            routing: moe.routing,
        })
    }

    /// The block's output for `x` `(..., hidden)`: each token's experts'
    /// outputs weighted by their router probabilities.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.router.forward(x)?;
        let k = self.top_k;
        let top_k = |a: &Array| -> Result<Array> {
            let experts = a.dim(-1);
            argpartition_axis(a, -k, -1)?.at((Ellipsis, experts - k..))
        };
        match self.routing {
            Routing::SoftmaxTopK { normalize } => {
                let gates = softmax_axis(&logits, -1, true)?;
                let indices = top_k(&gates)?;
                let mut scores = gates.take_along_axis(&indices, -1)?;
                if normalize {
                    scores = scores.divide(scores.sum_axis(-1, true)?)?;
                }
                let y = self.experts.forward(x, &indices)?;
                Ok(y.multiply(scores.expand_dims(-1)?)?
                    .sum_axis(-2, None)?
                    .as_dtype(y.dtype())?)
            }
            Routing::TopKSoftmax => {
                let indices = top_k(&logits)?;
                let weights = softmax_axis(logits.take_along_axis(&indices, -1)?, -1, true)?;
                let y = self.experts.forward(x, &indices)?;
                Ok(y.multiply(weights.expand_dims(-1)?)?.sum_axis(-2, None)?)
            }
        }
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut all = self.router.arrays();
        all.extend(self.experts.arrays());
        all
    }
}
