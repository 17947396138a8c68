//! `config.json` of a model folder: which architecture, which shapes, which quantization.
//!
//! The defaults follow mlx-lm 0.32's model classes (`llama`, `qwen2`,
//! `qwen3`, `phi3`, `gemma3_text`, `qwen3_moe`, `gpt_oss`; `mistral` is
//! served by the Llama code, as mlx-lm remaps it; `gemma3` is Gemma 3's text
//! model inside its `text_config`), so a folder that loads there loads here
//! with the same
//! numbers.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The `model_type` values this engine implements.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma3_text",
    "gemma3",
    "qwen3_moe",
    "gpt_oss",
    "mimo",
];

/// The model families this engine implements; they differ only in a few details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2 and 3 (and their many derivatives).
    Llama,
    /// Mistral (dense), computed as Llama.
    Mistral,
    /// Qwen2 and Qwen2.5: biases on the q/k/v projections. Also Xiaomi's
    /// MiMo (`mimo`): Qwen2's network plus multi-token-prediction layers
    /// (see [`ModelConfig::mtp_layers`]).
    Qwen2,
    /// Qwen3 (dense): RMS norms on queries and keys, explicit `head_dim`.
    Qwen3,
    /// Phi-3 and Phi-4-mini: fused `qkv_proj` and `gate_up_proj` weights,
    /// partial rotary embeddings, Su/LongRoPE scaling.
    Phi3,
    /// Gemma 3's text model (`gemma3_text`, or `gemma3`'s `text_config`):
    /// norms of weight `1 + w` before and after attention and MLP, a scaled
    /// embedding, a GELU MLP, and sliding-window layers among global ones.
    Gemma3,
    /// Qwen3 mixture-of-experts: Qwen3's attention, routed experts on the
    /// sparse layers (see [`MoeConfig`]).
    Qwen3Moe,
    /// gpt-oss: routed experts on every layer, biases everywhere, attention
    /// sinks, sliding-window and full attention layers in turn, YaRN RoPE.
    GptOss,
}

impl Family {
    fn parse(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "mistral" => Some(Self::Mistral),
            "qwen2" | "mimo" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            "phi3" => Some(Self::Phi3),
            "gemma3_text" | "gemma3" => Some(Self::Gemma3),
            "qwen3_moe" => Some(Self::Qwen3Moe),
            "gpt_oss" => Some(Self::GptOss),
            _ => None,
        }
    }
}

/// How rotary position embeddings scale with position.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Overall scale of low frequencies.
        factor: f32,
        /// Wavelength boundary (as a fraction of the original context) of low frequencies.
        low_freq_factor: f32,
        /// Wavelength boundary of high frequencies.
        high_freq_factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f32,
    },
    /// Phi-3's Su / LongRoPE scaling as mlx-lm's `SuScaledRoPE` computes it:
    /// the base frequencies times `long_factor` (mlx-lm uses the long
    /// factors at every length; transformers switches to `short_factor`
    /// below the original context), and the rotated part of queries and
    /// keys multiplied by `scale` first.
    SuScaled {
        /// One factor per rotated pair of dimensions.
        long_factor: Vec<f32>,
        /// `sqrt(1 + ln(max / original) / ln(original))` of the context
        /// lengths, or 1 where the model was not extended.
        scale: f32,
    },
    /// YaRN (mlx-lm's `YarnRoPE`): frequencies blended between plain and
    /// scaled by the correction range, and queries and keys scaled by
    /// `mscale`. mlx-lm builds it for gpt-oss.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f32,
        /// Rotations at which the blend starts (high frequencies).
        beta_fast: f32,
        /// Rotations at which it ends (low frequencies).
        beta_slow: f32,
        /// Attention scale factor.
        mscale: f32,
        /// Its divisor's factor.
        mscale_all_dim: f32,
    },
}

/// Sliding-window attention: some layers attend only to the last `size`
/// positions (Gemma 3).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query of a sliding layer sees: itself and those before it.
    pub size: i32,
    /// Per layer, whether it slides; the others attend to every position.
    pub layers: Vec<bool>,
    /// RoPE base of the sliding layers (Gemma's `rope_local_base_freq`),
    /// never scaled; `None`: the model's RoPE (gpt-oss).
    pub rope_theta: Option<f32>,
}

/// MLX quantization of a linear or embedding layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    /// Weights that share one scale (and bias).
    pub group_size: i32,
    /// Bits per weight.
    pub bits: i32,
    /// How the weights are packed.
    pub mode: QuantMode,
}

/// How MLX packs a quantized layer's weights (its `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// Integers with a float scale and bias per group.
    Affine,
    /// OCP MXFP4: 4-bit floats with a power-of-two scale (`uint8`) per 32
    /// weights and no biases, as gpt-oss ships its experts.
    Mxfp4,
}

impl QuantMode {
    /// The name MLX and `config.json` give the mode.
    pub fn name(self) -> &'static str {
        match self {
            Self::Affine => "affine",
            Self::Mxfp4 => "mxfp4",
        }
    }
}

/// The `quantization` block of an MLX-quantized checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantization {
    /// Parameters of every quantized layer without an override.
    pub default: QuantParams,
    /// Per-layer overrides by module path (`model.layers.0.mlp.down_proj`);
    /// `None` means that layer is not quantized.
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// The parameters for the module at `path` (whether it is quantized at
    /// all is decided by the presence of its `scales` tensor, as in mlx-lm).
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(over) => *over,
            None => Some(self.default),
        }
    }
}

/// The routed experts of a mixture-of-experts model.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts in each sparse layer.
    pub num_experts: i32,
    /// Experts each token is routed to (the router's top k).
    pub experts_per_token: i32,
    /// Width of one expert's MLP.
    pub intermediate_size: i32,
    /// How the router's logits become the chosen experts' weights.
    pub routing: Routing,
    /// Biases on the router and the experts' projections (gpt-oss).
    pub bias: bool,
    /// The experts' gated activation.
    pub activation: ExpertActivation,
    /// Per layer, whether its MLP is the sparse block (else the dense MLP of
    /// `intermediate_size`): Qwen3's `decoder_sparse_step` and
    /// `mlp_only_layers`, as mlx-lm reads them.
    pub sparse_layers: Vec<bool>,
}

/// How a router's logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over all experts, then the top k (Qwen3-MoE); with
    /// `normalize` (`norm_topk_prob`) the k probabilities are divided by
    /// their sum.
    SoftmaxTopK {
        /// Renormalise the chosen experts' probabilities.
        normalize: bool,
    },
    /// The top k logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
}

/// The gated activation of the experts' MLPs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss's: the gate clamped from above at `limit`, `up` to
    /// `[-limit, limit]`, then `(up + 1) * gate * sigmoid(alpha * gate)`.
    SwigluClamped {
        /// The gate's slope in the sigmoid.
        alpha: f32,
        /// The clamp.
        limit: f32,
    },
}

/// A validated model configuration.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The architecture.
    pub family: Family,
    /// Width of the residual stream.
    pub hidden_size: i32,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Width of the MLP.
    pub intermediate_size: i32,
    /// Query heads.
    pub num_heads: i32,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: i32,
    /// Width of one head.
    pub head_dim: i32,
    /// Rows of the embedding table.
    pub vocab_size: i32,
    /// Epsilon of every RMS norm.
    pub rms_norm_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// GPT-J style (interleaved) RoPE instead of the NeoX style.
    pub rope_traditional: bool,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// The output projection reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Biases on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Biases on the MLP projections.
    pub mlp_bias: bool,
    /// MLX quantization, when the checkpoint is quantized.
    pub quantization: Option<Quantization>,
    /// The routed experts, for mixture-of-experts families.
    pub moe: Option<MoeConfig>,
    /// Per-head attention sinks (gpt-oss): a learned logit each head's
    /// softmax adds to its keys'.
    pub attention_sinks: bool,
    /// End-of-sequence ids declared in `config.json`.
    pub eos_token_ids: Vec<u32>,
    /// Dimensions of a head that RoPE rotates (`partial_rotary_factor`).
    pub rope_dims: i32,
    /// The attention scale: `head_dim^-0.5`, or Gemma's
    /// `query_pre_attn_scalar^-0.5`.
    pub attention_scale: f32,
    /// Sliding-window layers, if the model has any.
    pub sliding_window: Option<SlidingWindow>,
    /// Final logits soft-capped to `cap * tanh(logits / cap)`.
    pub final_logit_softcapping: Option<f32>,
    /// What the checkpoint's tensor names start with: `language_model.` for
    /// the text model of a `gemma3` (vision-language) folder.
    pub weights_prefix: String,
    /// The multi-token-prediction layers the config declares
    /// (`num_nextn_predict_layers` of a `mimo` model; 0 for other
    /// families). The checkpoint may still lack them: mlx-lm's converter
    /// drops them, and [`crate::Model::mtp_layers`] counts those loaded.
    pub mtp_layers: usize,
}

/// The subset of `config.json` that is read, as written.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    hidden_size: Option<i32>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<i32>,
    num_attention_heads: Option<i32>,
    num_key_value_heads: Option<i32>,
    head_dim: Option<i32>,
    vocab_size: Option<i32>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    #[serde(default)]
    rope_traditional: bool,
    rope_scaling: Option<Value>,
    /// transformers >= 5 nests `rope_theta` and the scaling here.
    rope_parameters: Option<Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    layer_types: Option<Vec<String>>,
    quantization: Option<Value>,
    quantization_config: Option<Value>,
    eos_token_id: Option<Value>,
    partial_rotary_factor: Option<f32>,
    max_position_embeddings: Option<f32>,
    original_max_position_embeddings: Option<f32>,
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<i32>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f32>,
    final_logit_softcapping: Option<f32>,
    attn_logit_softcapping: Option<f32>,
    use_bidirectional_attention: Option<bool>,
    num_experts: Option<i32>,
    num_experts_per_tok: Option<i32>,
    moe_intermediate_size: Option<i32>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    norm_topk_prob: Option<bool>,
    num_local_experts: Option<i32>,
    num_nextn_predict_layers: Option<usize>,
}

/// mlx-lm's `gemma3_text.ModelArgs` defaults, for the fields a config leaves out.
fn gemma3_defaults() -> [(&'static str, Value); 14] {
    [
        ("hidden_size", 1152.into()),
        ("num_hidden_layers", 26.into()),
        ("intermediate_size", 6912.into()),
        ("num_attention_heads", 4.into()),
        ("head_dim", 256.into()),
        ("rms_norm_eps", 1.0e-6.into()),
        ("vocab_size", 262_144.into()),
        ("num_key_value_heads", 1.into()),
        ("rope_theta", 1_000_000.0.into()),
        ("rope_local_base_freq", 10_000.0.into()),
        ("query_pre_attn_scalar", 256.into()),
        ("sliding_window", 512.into()),
        ("sliding_window_pattern", 6.into()),
        ("max_position_embeddings", 32768.into()),
    ]
}

/// The text model's config of a `gemma3` folder, as mlx-lm's `gemma3.ModelArgs`
/// builds it: `text_config` with the top level's `vocab_size` (262 208 by
/// default) and 8 query and 4 key/value heads unless it says otherwise; the
/// end-of-sequence ids of the top level where the text config has none.
fn gemma3_text_config(top: &Value) -> Option<Value> {
    let mut text = top.get("text_config")?.as_object()?.clone();
    let vocab = top.get("vocab_size").cloned().unwrap_or(262_208.into());
    text.insert("vocab_size".into(), vocab);
    text.entry("num_attention_heads").or_insert(8.into());
    text.entry("num_key_value_heads").or_insert(4.into());
    if let Some(eos) = top.get("eos_token_id") {
        text.entry("eos_token_id").or_insert(eos.clone());
    }
    if let Some(q) = top.get("quantization") {
        text.insert("quantization".into(), q.clone());
    }
    text.insert("model_type".into(), "gemma3".into());
    Some(Value::Object(text))
}

impl ModelConfig {
    /// Reads `config.json` from a model folder.
    pub fn load(model_dir: &Path) -> Result<Self> {
        let path = model_dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, &path)
    }

    /// Parses the text of a `config.json`; `path` only labels errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let json_error = |source| Error::Json {
            path: path.to_owned(),
            source,
        };
        let mut value: Value = serde_json::from_str(text).map_err(json_error)?;
        let top_type = value.get("model_type").and_then(Value::as_str);
        let weights_prefix = if top_type == Some("gemma3") {
            value = gemma3_text_config(&value).ok_or_else(|| Error::InvalidConfig {
                path: path.to_owned(),
                what: "model type 'gemma3' without a \"text_config\" object".into(),
            })?;
            "language_model."
        } else {
            ""
        };
        if matches!(
            value.get("model_type").and_then(Value::as_str),
            Some("gemma3" | "gemma3_text")
        ) {
            if let Some(fields) = value.as_object_mut() {
                for (key, default) in gemma3_defaults() {
                    if fields.get(key).is_none_or(Value::is_null) {
                        fields.insert(key.into(), default);
                    }
                }
            }
        }
        let raw: RawConfig = serde_json::from_value(value).map_err(json_error)?;
        let invalid = |what: String| Error::InvalidConfig {
            path: path.to_owned(),
            what,
        };
        let unsupported = |what: String| Error::UnsupportedConfig {
            path: path.to_owned(),
            what,
        };
        let model_type = raw
            .model_type
            .clone()
            .ok_or_else(|| invalid("no \"model_type\"".into()))?;
        let family = Family::parse(&model_type).ok_or_else(|| Error::UnsupportedModelType {
            model_type: model_type.clone(),
            path: path.to_owned(),
        })?;
        let required = |value: Option<i32>, name: &str| {
            value
                .filter(|v| *v > 0)
                .ok_or_else(|| invalid(format!("\"{name}\" is missing or not positive")))
        };
        let hidden_size = required(raw.hidden_size, "hidden_size")?;
        let num_heads = required(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = match raw.num_key_value_heads {
            Some(n) => required(Some(n), "num_key_value_heads")?,
            None if family == Family::Qwen2 => {
                return Err(invalid("\"num_key_value_heads\" is missing".into()))
            }
            None => num_heads,
        };
        if num_heads % num_kv_heads != 0 {
            return Err(invalid(format!(
                "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = match family {
            // mlx-lm's Qwen2 and Phi-3 ignore a `head_dim` entry.
            Family::Qwen2 | Family::Phi3 => hidden_size / num_heads,
            Family::Qwen3 | Family::Gemma3 | Family::Qwen3Moe => {
                required(raw.head_dim, "head_dim")?
            }
            // mlx-lm's default.
            Family::GptOss => required(raw.head_dim.or(Some(64)), "head_dim")?,
            Family::Llama | Family::Mistral => match raw.head_dim {
                Some(d) => required(Some(d), "head_dim")?,
                None => hidden_size / num_heads,
            },
        };
        let num_layers = raw
            .num_hidden_layers
            .filter(|n| *n > 0)
            .ok_or_else(|| invalid("\"num_hidden_layers\" is missing or not positive".into()))?;
        let sliding_window = if family == Family::Gemma3 {
            Some(gemma3_window(&raw, num_layers).map_err(&invalid)?)
        } else if family == Family::GptOss {
            Some(gpt_oss_window(&raw, num_layers).map_err(&invalid)?)
        } else {
            if let Some(types) = &raw.layer_types {
                if types.iter().any(|t| t != "full_attention") {
                    return Err(unsupported(
                        "sliding-window attention (\"layer_types\")".into(),
                    ));
                }
            }
            None
        };
        if raw.use_bidirectional_attention == Some(true) {
            // EmbeddingGemma: a gemma3_text whose every query sees every position.
            return Err(unsupported(
                "bidirectional attention (\"use_bidirectional_attention\")".into(),
            ));
        }
        if let Some(cap) = raw.attn_logit_softcapping {
            return Err(unsupported(format!(
                "attention logit soft-capping (\"attn_logit_softcapping\": {cap})"
            )));
        }

        let rope = raw.rope_parameters.as_ref();
        let rope_theta = raw
            .rope_theta
            .or_else(|| {
                rope.and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
                    .map(|v| v as f32)
            })
            .or(match family {
                Family::Llama | Family::Mistral | Family::Phi3 => Some(10_000.0),
                // mlx-lm's `mimo` defaults to 10 000, its `qwen2` to 10^6.
                Family::Qwen2 if model_type == "mimo" => Some(10_000.0),
                Family::Qwen2 | Family::Gemma3 => Some(1_000_000.0),
                Family::Qwen3 | Family::Qwen3Moe => None,
                Family::GptOss => Some(150_000.0),
            })
            .ok_or_else(|| invalid("\"rope_theta\" is missing".into()))?;
        let scaling = raw.rope_scaling.as_ref().or(rope);
        let rope_scaling = match family {
            Family::Phi3 => phi3_rope_scaling(scaling, &raw),
            // mlx-lm's Qwen3-MoE builds plain RoPE whatever the config says
            // (some checkpoints declare YaRN for long contexts).
            Family::Qwen3Moe => Ok(RopeScaling::None),
            // YaRN is what gpt-oss declares; mlx-lm builds it for gpt-oss.
            Family::GptOss => parse_rope_scaling(scaling, true),
            _ => parse_rope_scaling(scaling, false),
        }
        .map_err(&unsupported)?;
        // mlx-lm's Phi-3 rotates `int(head_dim * partial_rotary_factor)` dimensions.
        let rope_dims = match (family, raw.partial_rotary_factor) {
            (Family::Phi3, Some(f)) => (head_dim as f64 * f as f64) as i32,
            _ => head_dim,
        };
        if rope_dims <= 0 || rope_dims % 2 != 0 {
            return Err(invalid(format!(
                "partial_rotary_factor gives {rope_dims} rotated dimensions of {head_dim}"
            )));
        }
        if let RopeScaling::SuScaled { long_factor, .. } = &rope_scaling {
            if long_factor.len() as i32 != rope_dims / 2 {
                return Err(invalid(format!(
                    "rope_scaling has {} long factors for {rope_dims} rotated dimensions \
                     (one per pair wanted)",
                    long_factor.len()
                )));
            }
        }
        // As Python computes it: in double precision, then a float.
        let attention_scale = match family {
            Family::Gemma3 => raw.query_pre_attn_scalar.unwrap_or(256.0),
            _ => head_dim as f64,
        }
        .powf(-0.5) as f32;

        let quantization = match (&raw.quantization, &raw.quantization_config) {
            (Some(q), _) => Some(parse_quantization(q).map_err(&unsupported)?),
            // OpenAI's gpt-oss release: MXFP4 experts, every other layer
            // dense; mlx-lm reads it as MXFP4 with MLX's defaults.
            (None, Some(q)) if q.get("quant_method").and_then(Value::as_str) == Some("mxfp4") => {
                Some(Quantization {
                    default: QuantParams {
                        group_size: 32,
                        bits: 4,
                        mode: QuantMode::Mxfp4,
                    },
                    overrides: BTreeMap::new(),
                })
            }
            (None, Some(q)) if q.get("quant_method").is_some() => {
                return Err(unsupported(format!(
                    "quantization method {} (native-mlx reads MLX's own, affine or mxfp4: \
                     convert the model with mlx_lm.convert)",
                    q["quant_method"]
                )))
            }
            (None, _) => None,
        };

        let attention_bias = raw.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias, mlp_bias) = match family {
            Family::Llama | Family::Mistral => (
                attention_bias,
                attention_bias,
                raw.mlp_bias.unwrap_or(false),
            ),
            Family::Qwen2 => (true, false, false),
            Family::Qwen3 | Family::Phi3 | Family::Gemma3 => (false, false, false),
            Family::Qwen3Moe => (false, false, false),
            Family::GptOss => (true, true, false),
        };
        let moe = match family {
            Family::Qwen3Moe => {
                let num_experts = required(raw.num_experts, "num_experts")?;
                let experts_per_token = required(raw.num_experts_per_tok, "num_experts_per_tok")?;
                if experts_per_token > num_experts {
                    return Err(invalid(format!(
                        "num_experts_per_tok ({experts_per_token}) exceeds num_experts ({num_experts})"
                    )));
                }
                // transformers' defaults: every layer sparse, no renormalising.
                let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
                let dense = raw.mlp_only_layers.clone().unwrap_or_default();
                Some(MoeConfig {
                    num_experts,
                    experts_per_token,
                    intermediate_size: required(
                        raw.moe_intermediate_size,
                        "moe_intermediate_size",
                    )?,
                    routing: Routing::SoftmaxTopK {
                        normalize: raw.norm_topk_prob.unwrap_or(false),
                    },
                    bias: false,
                    activation: ExpertActivation::Swiglu,
                    sparse_layers: (0..num_layers)
                        .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
                        .collect(),
                })
            }
            Family::GptOss => {
                // mlx-lm's defaults (gpt-oss-120b's).
                let num_experts =
                    required(raw.num_local_experts.or(Some(128)), "num_local_experts")?;
                let experts_per_token =
                    required(raw.num_experts_per_tok.or(Some(4)), "num_experts_per_tok")?;
                if experts_per_token > num_experts {
                    return Err(invalid(format!(
                        "num_experts_per_tok ({experts_per_token}) exceeds num_local_experts ({num_experts})"
                    )));
                }
                Some(MoeConfig {
                    num_experts,
                    experts_per_token,
                    intermediate_size: required(raw.intermediate_size, "intermediate_size")?,
                    routing: Routing::TopKSoftmax,
                    bias: true,
                    // mlx-lm's `SwigluOAI()`, whatever `swiglu_limit` says.
                    activation: ExpertActivation::SwigluClamped {
                        alpha: 1.702,
                        limit: 7.0,
                    },
                    sparse_layers: vec![true; num_layers],
                })
            }
            _ => None,
        };
        // Gemma 3 ties its output projection exactly when the checkpoint has
        // none (mlx-lm decides in `sanitize`); see `Model::load`.
        let tie_default = !matches!(
            family,
            Family::Qwen3 | Family::Phi3 | Family::Gemma3 | Family::Qwen3Moe
        );

        Ok(Self {
            family,
            hidden_size,
            num_layers,
            intermediate_size: required(raw.intermediate_size, "intermediate_size")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: required(raw.vocab_size, "vocab_size")?,
            rms_norm_eps: raw
                .rms_norm_eps
                .ok_or_else(|| invalid("\"rms_norm_eps\" is missing".into()))?,
            rope_theta,
            rope_traditional: raw.rope_traditional,
            rope_scaling,
            // mlx-lm's gpt-oss always has its own output projection.
            tie_word_embeddings: family != Family::GptOss
                && raw.tie_word_embeddings.unwrap_or(tie_default),
            qkv_bias,
            o_bias,
            mlp_bias,
            quantization,
            moe,
            attention_sinks: family == Family::GptOss,
            eos_token_ids: token_ids(raw.eos_token_id.as_ref()),
            rope_dims,
            attention_scale,
            sliding_window,
            final_logit_softcapping: raw.final_logit_softcapping,
            weights_prefix: weights_prefix.into(),
            // mlx-lm's `mimo` default (MiMo-7B's configs say 1).
            mtp_layers: match model_type.as_str() {
                "mimo" => raw.num_nextn_predict_layers.unwrap_or(2),
                _ => 0,
            },
        })
    }
}

/// Reads an `eos_token_id`-style value: one id, a list of ids, or nothing.
pub(crate) fn token_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| id as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// The RoPE scaling of a config; `yarn` only where the family's mlx-lm
/// model builds it (`allow_yarn`).
fn parse_rope_scaling(value: Option<&Value>, allow_yarn: bool) -> Result<RopeScaling, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = value
        .get("type")
        .or_else(|| value.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number = |key: &str, default: Option<f32>| {
        value
            .get(key)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
            .or(default)
            .ok_or_else(|| format!("rope scaling '{kind}' without \"{key}\""))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: number("factor", None)?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: number("factor", None)?,
            low_freq_factor: number("low_freq_factor", Some(1.0))?,
            high_freq_factor: number("high_freq_factor", Some(4.0))?,
            original_max_position_embeddings: number(
                "original_max_position_embeddings",
                Some(8192.0),
            )?,
        }),
        "yarn" if allow_yarn => Ok(RopeScaling::Yarn {
            factor: number("factor", None)?,
            original_max_position_embeddings: number(
                "original_max_position_embeddings",
                Some(4096.0),
            )?,
            beta_fast: number("beta_fast", Some(32.0))?,
            beta_slow: number("beta_slow", Some(1.0))?,
            mscale: number("mscale", Some(1.0))?,
            mscale_all_dim: number("mscale_all_dim", Some(0.0))?,
        }),
        other => Err(format!(
            "rope scaling type '{other}' (supported: default, linear, llama3{})",
            if allow_yarn { ", yarn" } else { "" }
        )),
    }
}

/// Phi-3's `rope_scaling` as mlx-lm's `phi3` reads it: `su` or `longrope`
/// (with `long_factor`), or `linear`; the context lengths come from the top
/// level of the config.
fn phi3_rope_scaling(value: Option<&Value>, raw: &RawConfig) -> Result<RopeScaling, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = value
        .get("type")
        .or_else(|| value.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::None),
        "su" | "longrope" => {
            let long_factor = value
                .get("long_factor")
                .and_then(Value::as_array)
                .and_then(|l| l.iter().map(|f| f.as_f64().map(|f| f as f32)).collect())
                .ok_or_else(|| format!("rope scaling '{kind}' without a \"long_factor\" list"))?;
            let max = raw.max_position_embeddings.unwrap_or(131_072.0) as f64;
            let original = raw.original_max_position_embeddings.unwrap_or(4096.0) as f64;
            let factor = max / original;
            let scale = if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / original.ln()).sqrt()
            };
            Ok(RopeScaling::SuScaled {
                long_factor,
                scale: scale as f32,
            })
        }
        "linear" => parse_rope_scaling(Some(value), false),
        other => Err(format!(
            "Phi-3 rope scaling type '{other}' (supported: su, longrope, linear)"
        )),
    }
}

/// Gemma 3's sliding-window layers: `layer_types` where the config lists
/// them, else every `sliding_window_pattern`-th layer is global (mlx-lm's
/// rule: layer `i` is global when `i % pattern == pattern - 1`).
fn gemma3_window(raw: &RawConfig, layers: usize) -> Result<SlidingWindow, String> {
    let size = raw
        .sliding_window
        .filter(|w| *w > 0)
        .ok_or("\"sliding_window\" is not positive")?;
    let pattern = raw
        .sliding_window_pattern
        .filter(|p| *p > 0)
        .ok_or("\"sliding_window_pattern\" is not positive")?;
    let layers = match listed_layers(raw, layers)? {
        Some(listed) => listed,
        None => (0..layers).map(|i| i % pattern != pattern - 1).collect(),
    };
    Ok(SlidingWindow {
        size,
        layers,
        rope_theta: Some(raw.rope_local_base_freq.unwrap_or(10_000.0)),
    })
}

/// gpt-oss's sliding-window layers, with mlx-lm's defaults: `layer_types`,
/// else sliding and full in turn; a window of 128. They rotate as the
/// model's full layers do (YaRN).
fn gpt_oss_window(raw: &RawConfig, layers: usize) -> Result<SlidingWindow, String> {
    let size = raw
        .sliding_window
        .or(Some(128))
        .filter(|w| *w > 0)
        .ok_or("\"sliding_window\" is not positive")?;
    Ok(SlidingWindow {
        size,
        layers: listed_layers(raw, layers)?
            .unwrap_or_else(|| (0..layers).map(|i| i % 2 == 0).collect()),
        rope_theta: None,
    })
}

/// Per layer, whether `layer_types` lists it as sliding; `None` where the
/// config has no `layer_types`.
fn listed_layers(raw: &RawConfig, layers: usize) -> Result<Option<Vec<bool>>, String> {
    let Some(types) = &raw.layer_types else {
        return Ok(None);
    };
    if types.len() != layers {
        return Err(format!(
            "\"layer_types\" lists {} layers, num_hidden_layers is {layers}",
            types.len()
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "sliding_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(format!("layer type '{other}' in \"layer_types\"")),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn parse_quantization(value: &Value) -> Result<Quantization, String> {
    let params = |v: &Value, fallback: Option<QuantParams>| -> Result<QuantParams, String> {
        let field = |key: &str, default: Option<i32>| {
            v.get(key)
                .and_then(Value::as_i64)
                .map(|n| n as i32)
                .or(default)
                .ok_or_else(|| format!("a quantization block without \"{key}\""))
        };
        // A layer's own block without a mode is affine: MLX's
        // `to_quantized(**block)` defaults it so, whatever the model's mode.
        let mode = match v.get("mode").and_then(Value::as_str) {
            None | Some("affine") => QuantMode::Affine,
            Some("mxfp4") => QuantMode::Mxfp4,
            Some(mode) => {
                return Err(format!(
                    "quantization mode '{mode}' (only 'affine' and 'mxfp4' are)"
                ))
            }
        };
        Ok(QuantParams {
            group_size: field("group_size", fallback.map(|p| p.group_size))?,
            bits: field("bits", fallback.map(|p| p.bits))?,
            mode,
        })
    };
    let default = params(value, None)?;
    let mut overrides = BTreeMap::new();
    if let Some(entries) = value.as_object() {
        for (key, entry) in entries {
            match entry {
                Value::Object(_) => {
                    overrides.insert(key.clone(), Some(params(entry, Some(default))?));
                }
                Value::Bool(false) => {
                    overrides.insert(key.clone(), None);
                }
                _ => {}
            }
        }
    }
    Ok(Quantization { default, overrides })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelConfig> {
        ModelConfig::parse(json, Path::new("m/config.json"))
    }

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "rms_norm_eps": 1e-6, "eos_token_id": [2, 7]}"#;

    #[test]
    fn unknown_model_type_names_the_supported_ones() {
        let err = parse(r#"{"model_type": "gpt2"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "model type 'gpt2' in m/config.json is not supported by native-mlx; \
             supported model types: llama, mistral, qwen2, qwen3, phi3, gemma3_text, gemma3, \
             qwen3_moe, gpt_oss, mimo"
        );
    }

    #[test]
    fn llama_defaults_follow_mlx_lm() {
        let c = parse(LLAMA).unwrap();
        assert_eq!(c.family, Family::Llama);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rope_theta, 10_000.0);
        assert!(c.tie_word_embeddings);
        assert!(!c.qkv_bias);
        assert_eq!(c.eos_token_ids, vec![2, 7]);
        assert!(c.quantization.is_none());
    }

    #[test]
    fn qwen2_has_qkv_bias_and_ignores_head_dim() {
        let json = LLAMA
            .replace("\"llama\"", "\"qwen2\"")
            .replace("\"vocab_size\"", "\"head_dim\": 99, \"vocab_size\"");
        let c = parse(&json).unwrap();
        assert_eq!((c.qkv_bias, c.o_bias, c.head_dim), (true, false, 16));
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.mtp_layers, 0);
    }

    #[test]
    fn mimo_is_qwen2_with_its_mtp_layers_and_rope_default() {
        let mimo = LLAMA.replace("\"llama\"", "\"mimo\"");
        let c = parse(&mimo).unwrap();
        assert_eq!(
            (c.family, c.qkv_bias, c.head_dim),
            (Family::Qwen2, true, 16)
        );
        // mlx-lm's `mimo` defaults: RoPE base 10 000, two MTP layers.
        assert_eq!((c.rope_theta, c.mtp_layers), (10_000.0, 2));
        let one = mimo.replace(
            "\"vocab_size\"",
            "\"num_nextn_predict_layers\": 1, \"vocab_size\"",
        );
        assert_eq!(parse(&one).unwrap().mtp_layers, 1);
    }

    #[test]
    fn qwen3_reads_rope_parameters() {
        let json = LLAMA.replace("\"llama\"", "\"qwen3\"").replace(
            "\"vocab_size\"",
            "\"head_dim\": 32, \"rope_parameters\": {\"rope_theta\": 5000, \"rope_type\": \"default\"}, \"vocab_size\"",
        );
        let c = parse(&json).unwrap();
        assert_eq!((c.head_dim, c.rope_theta), (32, 5000.0));
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn qwen3_moe_reads_its_sparse_layers_as_mlx_lm_does() {
        let json = LLAMA
            .replace("\"llama\"", "\"qwen3_moe\"")
            .replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 6")
            .replace(
                "\"vocab_size\"",
                r#""head_dim": 16, "rope_theta": 1e6,
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "decoder_sparse_step": 2, "mlp_only_layers": [3],
                "rope_scaling": {"rope_type": "yarn", "factor": 4}, "vocab_size""#,
            );
        let c = parse(&json).unwrap();
        let moe = c.moe.unwrap();
        assert_eq!(
            moe.sparse_layers,
            [false, true, false, false, false, true],
            "every second layer but layer 3"
        );
        assert_eq!((moe.num_experts, moe.experts_per_token), (8, 2));
        assert_eq!(moe.routing, Routing::SoftmaxTopK { normalize: false });
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!(!c.tie_word_embeddings);
        let too_many = json.replace("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
        assert_eq!(
            parse(&too_many).unwrap_err().to_string(),
            "m/config.json: num_experts_per_tok (9) exceeds num_experts (8)"
        );
    }

    #[test]
    fn gpt_oss_reads_windows_yarn_and_sinks_with_mlx_lm_defaults() {
        let json = r#"{"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 3,
            "intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 512, "rms_norm_eps": 1e-5, "num_local_experts": 4,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": 8, "tie_word_embeddings": true,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "original_max_position_embeddings": 4096}}"#;
        let c = parse(json).unwrap();
        let window = c.sliding_window.clone().unwrap();
        assert_eq!((window.size, window.rope_theta), (8, None));
        assert_eq!(window.layers, [true, false, true]);
        assert!(c.attention_sinks && c.qkv_bias && c.o_bias);
        assert!(
            !c.tie_word_embeddings,
            "mlx-lm's gpt-oss has its own lm_head"
        );
        assert_eq!(c.rope_theta, 150_000.0);
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 32.0));
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token), (4, 4));
        assert_eq!(moe.routing, Routing::TopKSoftmax);
        assert_eq!(moe.sparse_layers, [true; 3]);
        // Without layer_types: sliding and full in turn, as mlx-lm.
        let json = json.replace(
            r#""layer_types": ["sliding_attention", "full_attention", "sliding_attention"],"#,
            "",
        );
        assert_eq!(
            parse(&json).unwrap().sliding_window.unwrap().layers,
            [true, false, true]
        );
        // Yarn stays refused where mlx-lm does not build it.
        let llama = LLAMA.replace(
            "\"vocab_size\"",
            r#""rope_scaling": {"rope_type": "yarn", "factor": 4}, "vocab_size""#,
        );
        assert!(parse(&llama).is_err());
    }

    #[test]
    fn quantization_with_overrides() {
        let json = LLAMA.replace(
            "\"vocab_size\"",
            r#""quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                "lm_head": {"bits": 8}, "model.embed_tokens": false}, "vocab_size""#,
        );
        let q = parse(&json).unwrap().quantization.unwrap();
        assert_eq!(
            q.default,
            QuantParams {
                group_size: 64,
                bits: 4,
                mode: QuantMode::Affine,
            }
        );
        assert_eq!(
            q.for_module("lm_head"),
            Some(QuantParams {
                group_size: 64,
                bits: 8,
                mode: QuantMode::Affine,
            })
        );
        assert_eq!(q.for_module("model.embed_tokens"), None);
    }

    #[test]
    fn phi3_reads_partial_rotary_and_longrope_as_mlx_lm() {
        let json = LLAMA.replace("\"llama\"", "\"phi3\"").replace(
            "\"vocab_size\"",
            r#""head_dim": 99, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "long_factor": [1, 2, 3, 4, 5, 6],
                "short_factor": [1, 1, 1, 1, 1, 1]}, "vocab_size""#,
        );
        let c = parse(&json).unwrap();
        assert_eq!((c.head_dim, c.rope_dims), (16, 12));
        let RopeScaling::SuScaled { long_factor, scale } = &c.rope_scaling else {
            panic!("{:?}", c.rope_scaling);
        };
        assert_eq!(long_factor, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let expected = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert_eq!(*scale, expected);
        assert!(!c.tie_word_embeddings);
        // One factor per rotated pair, and only Phi-3's scaling types.
        let short = json.replace("[1, 2, 3, 4, 5, 6]", "[1, 2]");
        assert!(parse(&short)
            .unwrap_err()
            .to_string()
            .contains("2 long factors"));
        let yarn = json.replace("\"longrope\"", "\"yarn\"");
        assert!(parse(&yarn).unwrap_err().to_string().contains("'yarn'"));
        let linear = LLAMA.replace("\"llama\"", "\"phi3\"").replace(
            "\"vocab_size\"",
            r#""rope_scaling": {"type": "linear", "factor": 2.0}, "vocab_size""#,
        );
        assert_eq!(
            parse(&linear).unwrap().rope_scaling,
            RopeScaling::Linear { factor: 2.0 }
        );
    }

    #[test]
    fn gemma3_text_layers_slide_by_pattern_or_layer_types() {
        let json = r#"{"model_type": "gemma3_text", "hidden_size": 64,
            "num_hidden_layers": 5, "intermediate_size": 128, "head_dim": 16,
            "vocab_size": 512, "query_pre_attn_scalar": 168, "sliding_window": 8,
            "sliding_window_pattern": 3, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#;
        let c = parse(json).unwrap();
        assert_eq!(c.family, Family::Gemma3);
        // mlx-lm's defaults: 4 query heads, 1 key/value head, its bases.
        assert_eq!(
            (c.num_heads, c.num_kv_heads, c.rope_theta),
            (4, 1, 1_000_000.0)
        );
        assert_eq!(c.attention_scale, 168f64.powf(-0.5) as f32);
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        let window = c.sliding_window.unwrap();
        assert_eq!((window.size, window.rope_theta), (8, Some(10_000.0)));
        assert_eq!(window.layers, [true, true, false, true, true]);
        assert_eq!(c.weights_prefix, "");
        let listed = json.replace(
            "\"sliding_window_pattern\": 3",
            r#""layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                "full_attention", "full_attention"]"#,
        );
        let layers = parse(&listed).unwrap().sliding_window.unwrap().layers;
        assert_eq!(layers, [true, false, true, false, false]);
        let capped = json.replace(
            "\"head_dim\"",
            "\"attn_logit_softcapping\": 50.0, \"head_dim\"",
        );
        assert!(parse(&capped)
            .unwrap_err()
            .to_string()
            .contains("attention logit soft-capping"));
        let both_ways = json.replace(
            "\"head_dim\"",
            "\"use_bidirectional_attention\": true, \"head_dim\"",
        );
        assert!(parse(&both_ways)
            .unwrap_err()
            .to_string()
            .contains("bidirectional attention"));
    }

    #[test]
    fn gemma3_reads_its_text_config() {
        let json = r#"{"model_type": "gemma3", "vocab_size": 1024, "eos_token_id": [1, 106],
            "text_config": {"model_type": "gemma3_text", "hidden_size": 64,
                "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 7,
                "final_logit_softcapping": 30.0},
            "vision_config": {"model_type": "siglip_vision_model"}}"#;
        let c = parse(json).unwrap();
        assert_eq!(c.family, Family::Gemma3);
        assert_eq!((c.vocab_size, c.num_heads, c.num_kv_heads), (1024, 8, 4));
        assert_eq!(c.head_dim, 256);
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert_eq!(c.weights_prefix, "language_model.");
        assert_eq!(c.final_logit_softcapping, Some(30.0));
        let no_text = parse(r#"{"model_type": "gemma3", "vocab_size": 1024}"#).unwrap_err();
        assert!(no_text.to_string().contains("\"text_config\""), "{no_text}");
    }

    #[test]
    fn unsupported_settings_are_named() {
        let json = LLAMA.replace(
            "\"vocab_size\"",
            r#""rope_scaling": {"type": "yarn", "factor": 4}, "vocab_size""#,
        );
        assert_eq!(
            parse(&json).unwrap_err().to_string(),
            "m/config.json: rope scaling type 'yarn' (supported: default, linear, llama3) \
             is not supported by native-mlx"
        );
        let json = LLAMA.replace(
            "\"vocab_size\"",
            r#""quantization_config": {"quant_method": "gptq"}, "vocab_size""#,
        );
        assert!(parse(&json).unwrap_err().to_string().contains("\"gptq\""));
    }
}
