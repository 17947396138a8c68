//! Linear and embedding layers, dense or MLX-quantized, computed exactly as `mlx.nn` computes them.

use mlx_rs::ops::{addmm, dequantize, matmul, quantized_matmul};
use mlx_rs::Array;

use crate::config::{QuantParams, Quantization};
use crate::error::{Error, Result};
use crate::model::weights::Weights;

/// A weight matrix `(out, in)` stored dense or as MLX affine-quantized groups.
pub(crate) enum Matrix {
    /// Dense; `transposed` is `weight.T`, a strided view made once at load
    /// so that no step has to add the transpose node to its graph.
    Dense { transposed: Array },
    /// Packed `uint32` weights with one scale and bias per group.
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        params: QuantParams,
    },
}

impl Matrix {
    /// Takes `{prefix}.weight` (and `scales`/`biases` when quantized) out of `weights`.
    fn take(
        weights: &mut Weights,
        prefix: &str,
        quantization: Option<&Quantization>,
    ) -> Result<Self> {
        let weight = weights.take(&format!("{prefix}.weight"))?;
        // As in mlx-lm, a layer is quantized exactly when its scales exist.
        if !weights.contains(&format!("{prefix}.scales")) {
            return Ok(Self::Dense {
                transposed: weight.transpose()?,
            });
        }
        let params = quantization
            .and_then(|q| q.for_module(prefix))
            .ok_or_else(|| Error::Weights {
                dir: weights.dir().to_owned(),
                what: format!(
                    "'{prefix}' is quantized but config.json has no quantization for it"
                ),
            })?;
        Ok(Self::Quantized {
            weight,
            scales: weights.take(&format!("{prefix}.scales"))?,
            biases: weights.take(&format!("{prefix}.biases"))?,
            params,
        })
    }

    /// `x @ W.T`, plus `bias` the way `nn.Linear` adds it.
    fn apply(&self, x: &Array, bias: Option<&Array>) -> Result<Array> {
        Ok(match (self, bias) {
            // nn.Linear fuses the bias into the GEMM (beta * bias), which
            // rounds differently from adding it afterwards.
            (Self::Dense { transposed }, Some(bias)) => addmm(bias, x, transposed, None, None)?,
            (Self::Dense { transposed }, None) => matmul(x, transposed)?,
            (
                Self::Quantized {
                    weight,
                    scales,
                    biases,
                    params,
                },
                bias,
            ) => {
                let y = quantized_matmul(
                    x,
                    weight,
                    scales,
                    biases,
                    true,
                    params.group_size,
                    params.bits,
                )?;
                match bias {
                    Some(bias) => y.add(bias)?,
                    None => y,
                }
            }
        })
    }

    /// All arrays, for evaluation at load.
    fn arrays(&self) -> Vec<&Array> {
        match self {
            Self::Dense { transposed } => vec![transposed],
            Self::Quantized {
                weight,
                scales,
                biases,
                ..
            } => vec![weight, scales, biases],
        }
    }
}

/// A linear layer: a matrix and an optional bias.
pub(crate) struct Linear {
    matrix: Matrix,
    bias: Option<Array>,
}

impl Linear {
    /// Takes the layer at `prefix`; `bias` says whether the architecture has one.
    pub(crate) fn take(
        weights: &mut Weights,
        prefix: &str,
        bias: bool,
        quantization: Option<&Quantization>,
    ) -> Result<Self> {
        let matrix = Matrix::take(weights, prefix, quantization)?;
        let bias = if bias {
            Some(weights.take(&format!("{prefix}.bias"))?)
        } else {
            None
        };
        Ok(Self { matrix, bias })
    }

    /// Applies the layer to `x` of shape `(..., in)`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        self.matrix.apply(x, self.bias.as_ref())
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut arrays = self.matrix.arrays();
        arrays.extend(self.bias.iter());
        arrays
    }
}

/// The token embedding table, usable as the output projection when tied.
pub(crate) struct Embedding {
    /// The table itself, `(vocab, hidden)`, dense or packed.
    table: Array,
    matrix: Matrix,
}

impl Embedding {
    pub(crate) fn take(
        weights: &mut Weights,
        prefix: &str,
        quantization: Option<&Quantization>,
    ) -> Result<Self> {
        let matrix = Matrix::take(weights, prefix, quantization)?;
        let table = match &matrix {
            Matrix::Dense { transposed } => transposed.transpose()?,
            Matrix::Quantized { weight, .. } => weight.clone(),
        };
        Ok(Self { table, matrix })
    }

    /// Looks up the rows of `ids`; quantized tables dequantize only the
    /// gathered rows.
    pub(crate) fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.matrix {
            Matrix::Dense { .. } => self.table.take_axis(ids, 0)?,
            Matrix::Quantized {
                weight,
                scales,
                biases,
                params,
            } => dequantize(
                weight.take_axis(ids, 0)?,
                scales.take_axis(ids, 0)?,
                &biases.take_axis(ids, 0)?,
                params.group_size,
                params.bits,
            )?,
        })
    }

    /// `x @ table.T`, for models whose output projection is tied to the embedding.
    pub(crate) fn as_linear(&self, x: &Array) -> Result<Array> {
        self.matrix.apply(x, None)
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        self.matrix.arrays()
    }
}
