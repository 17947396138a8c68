//! The BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa) as transformers' modeling files define it, with the sequence-classification heads of its cross-encoders.
//!
//! Post-LN blocks: self-attention with biases, then a GELU (erf) MLP, each
//! followed by a residual LayerNorm. A batch is right-padded to its longest
//! input; padded keys are masked out of every attention, so a padded row's
//! real positions see exactly what they would see alone.

use std::path::Path;

use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::{erf, tanh};
use mlx_rs::transforms::eval;
use mlx_rs::Array;

use crate::error::{Error, Result};
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::model::weights::Weights;
use crate::model::{layout_for, LoadOptions};

/// The encoder's shape, from `config.json`.
#[derive(Debug, Clone)]
pub(crate) struct EncoderConfig {
    pub(crate) hidden_size: i32,
    pub(crate) num_layers: usize,
    pub(crate) num_heads: i32,
    pub(crate) vocab_size: i32,
    pub(crate) type_vocab_size: i32,
    pub(crate) max_position_embeddings: i32,
    pub(crate) eps: f32,
    /// RoBERTa's `padding_idx`: positions start after it, and a padding
    /// id takes position `padding_idx`. `None` for BERT (positions from 0).
    pub(crate) roberta_padding: Option<u32>,
}

impl EncoderConfig {
    /// Reads the encoder fields of `config` (`config.json`, at `path`).
    pub(crate) fn from_json(config: &serde_json::Value, path: &Path) -> Result<Self> {
        let invalid = |what: String| Error::InvalidConfig {
            path: path.to_owned(),
            what,
        };
        let int = |name: &str| -> Result<i32> {
            config
                .get(name)
                .and_then(serde_json::Value::as_i64)
                .map(|n| n as i32)
                .ok_or_else(|| invalid(format!("'{name}' is missing or not an integer")))
        };
        let model_type = config
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let act = config
            .get("hidden_act")
            .and_then(|v| v.as_str())
            .unwrap_or("gelu");
        if act != "gelu" {
            return Err(Error::UnsupportedConfig {
                path: path.to_owned(),
                what: format!("hidden_act '{act}' (native-mlx's encoder computes 'gelu')"),
            });
        }
        if let Some(kind) = config
            .get("position_embedding_type")
            .and_then(|v| v.as_str())
            .filter(|k| *k != "absolute")
        {
            return Err(Error::UnsupportedConfig {
                path: path.to_owned(),
                what: format!("position_embedding_type '{kind}'"),
            });
        }
        let roberta = matches!(model_type, "roberta" | "xlm-roberta");
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        if num_heads <= 0 || hidden_size % num_heads != 0 {
            return Err(invalid(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"
            )));
        }
        Ok(Self {
            hidden_size,
            num_layers: int("num_hidden_layers")? as usize,
            num_heads,
            vocab_size: int("vocab_size")?,
            type_vocab_size: int("type_vocab_size").unwrap_or(2),
            max_position_embeddings: int("max_position_embeddings")?,
            eps: config
                .get("layer_norm_eps")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(1e-12) as f32,
            roberta_padding: roberta.then(|| int("pad_token_id").unwrap_or(1) as u32),
        })
    }

    /// The most tokens one input may have: the position table's rows, less
    /// the two RoBERTa skips (its positions start at `padding_idx + 1`).
    pub(crate) fn max_tokens(&self) -> usize {
        match self.roberta_padding {
            Some(pad) => (self.max_position_embeddings - pad as i32 - 1).max(0) as usize,
            None => self.max_position_embeddings as usize,
        }
    }

    /// The position ids of one input, as transformers computes them.
    fn positions(&self, ids: &[u32]) -> Vec<i32> {
        match self.roberta_padding {
            None => (0..ids.len() as i32).collect(),
            Some(pad) => {
                let mut seen = 0;
                ids.iter()
                    .map(|&id| {
                        if id == pad {
                            pad as i32
                        } else {
                            seen += 1;
                            pad as i32 + seen
                        }
                    })
                    .collect()
            }
        }
    }
}

/// The head of a cross-encoder: from the first token's hidden state to one
/// score per label.
pub(crate) enum Head {
    /// `BertForSequenceClassification`: the pooler (dense + tanh), then `classifier`.
    Bert { pooler: Linear, classifier: Linear },
    /// `(XLM)RobertaForSequenceClassification`: `classifier.dense` + tanh,
    /// then `classifier.out_proj`.
    Roberta { dense: Linear, out_proj: Linear },
}

struct EncoderLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// A loaded encoder, with its classification head when it is a cross-encoder.
pub(crate) struct Encoder {
    pub(crate) config: EncoderConfig,
    words: Embedding,
    positions: Array,
    token_types: Array,
    embedding_norm: LayerNorm,
    layers: Vec<EncoderLayer>,
    head: Option<Head>,
}

/// One padded batch, ready for [`Encoder::forward`].
pub(crate) struct Batch {
    /// `(batch, len)` token ids, right-padded.
    ids: Array,
    positions: Array,
    types: Array,
    /// `(batch, 1, 1, len)`: whether each key is a real token.
    mask: Array,
    /// The real length of each row.
    pub(crate) lens: Vec<usize>,
    /// The padded length.
    pub(crate) width: usize,
}

impl Encoder {
    /// Loads the encoder of `dir` (weights named as transformers writes
    /// them, with or without a `bert.` / `roberta.` prefix); `head` says
    /// which classification head to take as well.
    pub(crate) fn load(
        dir: &Path,
        config: EncoderConfig,
        head: Option<&str>,
        options: &LoadOptions,
    ) -> Result<Self> {
        let (layout, _) = layout_for(options)?;
        let mut w = Weights::load(dir)?;
        let prefix = ["", "bert.", "roberta."]
            .into_iter()
            .find(|p| w.contains(&format!("{p}embeddings.word_embeddings.weight")))
            .ok_or_else(|| Error::Weights {
                dir: dir.to_owned(),
                what: "no 'embeddings.word_embeddings.weight' (with or without a 'bert.' or \
                       'roberta.' prefix): not a BERT-family checkpoint"
                    .into(),
            })?;
        let name = |n: &str| format!("{prefix}{n}");
        let linear = |w: &mut Weights, n: &str| Linear::take(w, n, true, None, &layout);
        let words = Embedding::take(
            &mut w,
            &name("embeddings.word_embeddings"),
            None,
            false,
            &layout,
        )?;
        let positions = w.take(&name("embeddings.position_embeddings.weight"))?;
        let token_types = w.take(&name("embeddings.token_type_embeddings.weight"))?;
        let embedding_norm = LayerNorm::take(&mut w, &name("embeddings.LayerNorm"))?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = name(&format!("encoder.layer.{i}"));
            layers.push(EncoderLayer {
                query: linear(&mut w, &format!("{p}.attention.self.query"))?,
                key: linear(&mut w, &format!("{p}.attention.self.key"))?,
                value: linear(&mut w, &format!("{p}.attention.self.value"))?,
                attention_out: linear(&mut w, &format!("{p}.attention.output.dense"))?,
                attention_norm: LayerNorm::take(
                    &mut w,
                    &format!("{p}.attention.output.LayerNorm"),
                )?,
                intermediate: linear(&mut w, &format!("{p}.intermediate.dense"))?,
                output: linear(&mut w, &format!("{p}.output.dense"))?,
                output_norm: LayerNorm::take(&mut w, &format!("{p}.output.LayerNorm"))?,
            });
        }
        let head = match head {
            None => None,
            Some("bert") => Some(Head::Bert {
                pooler: linear(&mut w, &name("pooler.dense"))?,
                classifier: linear(&mut w, "classifier")?,
            }),
            Some(_) => Some(Head::Roberta {
                dense: linear(&mut w, "classifier.dense")?,
                out_proj: linear(&mut w, "classifier.out_proj")?,
            }),
        };
        // An embedder does not use BERT's pooler (sentence-transformers pools
        // itself); old checkpoints also carry the position-id buffer.
        w.finish(|n| n.contains("pooler.") || n.ends_with("position_ids"))?;
        let encoder = Self {
            config,
            words,
            positions,
            token_types,
            embedding_norm,
            layers,
            head,
        };
        eval(encoder.arrays())?;
        Ok(encoder)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut all = self.words.arrays();
        all.extend([&self.positions, &self.token_types]);
        all.extend([&self.embedding_norm.weight, &self.embedding_norm.bias]);
        for l in &self.layers {
            for linear in [
                &l.query,
                &l.key,
                &l.value,
                &l.attention_out,
                &l.intermediate,
                &l.output,
            ] {
                all.extend(linear.arrays());
            }
            for n in [&l.attention_norm, &l.output_norm] {
                all.extend([&n.weight, &n.bias]);
            }
        }
        match &self.head {
            Some(Head::Bert { pooler, classifier }) => {
                all.extend(pooler.arrays());
                all.extend(classifier.arrays());
            }
            Some(Head::Roberta { dense, out_proj }) => {
                all.extend(dense.arrays());
                all.extend(out_proj.arrays());
            }
            None => {}
        }
        all
    }

    /// Pads `inputs` (token ids, and token types where given) into one batch.
    pub(crate) fn batch(&self, inputs: &[(Vec<u32>, Option<Vec<u32>>)]) -> Batch {
        let width = inputs.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
        let rows = inputs.len();
        let pad = self.config.roberta_padding.unwrap_or(0);
        let mut ids = Vec::with_capacity(rows * width);
        let mut positions = Vec::with_capacity(rows * width);
        let mut types = Vec::with_capacity(rows * width);
        let mut mask = Vec::with_capacity(rows * width);
        for (row, row_types) in inputs {
            let n = row.len();
            let pos = self.config.positions(row);
            ids.extend(row.iter().map(|&t| t as i32));
            ids.extend(std::iter::repeat_n(pad as i32, width - n));
            positions.extend(&pos);
            positions.extend(std::iter::repeat_n(
                self.config.roberta_padding.map_or(0, |p| p as i32),
                width - n,
            ));
            // RoBERTa has one token type; pair templates may still number
            // the second segment, which transformers would not index either.
            let one_type = self.config.type_vocab_size <= 1;
            match row_types {
                Some(t) if !one_type => types.extend(t.iter().map(|&t| t as i32)),
                _ => types.extend(std::iter::repeat_n(0, n)),
            }
            types.extend(std::iter::repeat_n(0, width - n));
            mask.extend(std::iter::repeat_n(true, n));
            mask.extend(std::iter::repeat_n(false, width - n));
        }
        let (r, w) = (rows as i32, width as i32);
        Batch {
            ids: Array::from_slice(&ids, &[r, w]),
            positions: Array::from_slice(&positions, &[r, w]),
            types: Array::from_slice(&types, &[r, w]),
            mask: Array::from_slice(&mask, &[r, 1, 1, w]),
            lens: inputs.iter().map(|(ids, _)| ids.len()).collect(),
            width,
        }
    }

    /// The last hidden states `(batch, len, hidden)` of a batch. Lazy.
    pub(crate) fn forward(&self, batch: &Batch) -> Result<Array> {
        let c = &self.config;
        let x = self
            .words
            .forward(&batch.ids)?
            .add(self.positions.take_axis(&batch.positions, 0)?)?
            .add(self.token_types.take_axis(&batch.types, 0)?)?;
        let mut h = self.embedding_norm.apply(&x, c.eps)?;
        let (rows, width) = (batch.lens.len() as i32, batch.width as i32);
        let head_dim = c.hidden_size / c.num_heads;
        let scale = (head_dim as f32).powf(-0.5);
        let heads = |x: Array| -> Result<Array> {
            Ok(x.reshape(&[rows, width, c.num_heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        for layer in &self.layers {
            let q = heads(layer.query.forward(&h)?)?;
            let k = heads(layer.key.forward(&h)?)?;
            let v = heads(layer.value.forward(&h)?)?;
            let mask = ScaledDotProductAttentionMask::Array(&batch.mask);
            let a = scaled_dot_product_attention(q, k, v, scale, mask, None)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[rows, width, c.hidden_size])?;
            let a = layer.attention_out.forward(&a)?;
            h = layer.attention_norm.apply(&a.add(&h)?, c.eps)?;
            let m = gelu(&layer.intermediate.forward(&h)?)?;
            let m = layer.output.forward(&m)?;
            h = layer.output_norm.apply(&m.add(&h)?, c.eps)?;
        }
        Ok(h)
    }

    /// The classification head on the first token's states `(batch, hidden)`:
    /// scores `(batch, labels)`. `None` for an embedder. Lazy.
    pub(crate) fn classify(&self, first: &Array) -> Option<Result<Array>> {
        let run = |dense: &Linear, out: &Linear| -> Result<Array> {
            out.forward(&tanh(dense.forward(first)?)?)
        };
        Some(match self.head.as_ref()? {
            Head::Bert { pooler, classifier } => run(pooler, classifier),
            Head::Roberta { dense, out_proj } => run(dense, out_proj),
        })
    }
}

/// transformers' `gelu`: `x * (1 + erf(x / sqrt 2)) / 2`.
fn gelu(x: &Array) -> Result<Array> {
    // Constants in the activations' dtype: float32 scalars would promote a
    // float16 or bfloat16 model's activations to float32.
    let c = |v: f32| Array::from_f32(v).as_dtype(x.dtype());
    let half = x.multiply(c(0.5)?)?;
    let e = erf(x.multiply(c(std::f32::consts::FRAC_1_SQRT_2)?)?)?;
    Ok(half.multiply(e.add(c(1.0)?)?)?)
}
