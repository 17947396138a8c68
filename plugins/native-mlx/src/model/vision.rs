//! Gemma 3's vision tower (SigLIP) and multi-modal projector: an image's pixels to the soft tokens the text model reads in place of `<image_soft_token>`s.
//!
//! The graph is mlx-vlm's `gemma3` (`VisionModel`, `Gemma3MultiModalProjector`),
//! on weights named as its conversion writes them:
//!
//! - patch embedding: a convolution of stride = kernel = `patch_size`, which
//!   is a product of each patch's pixels (height, width, channel order) with
//!   the kernel as a `(hidden, patch * patch * channels)` matrix, plus its bias;
//! - learned position embeddings, one per patch;
//! - pre-LN encoder layers: LayerNorm, bidirectional multi-head attention
//!   with biases, residual; LayerNorm, GELU (tanh) MLP with biases, residual;
//! - a final LayerNorm (`post_layernorm`);
//! - the projector: the patch grid averaged in square windows down to
//!   `mm_tokens_per_image` tokens, Gemma's RMS norm (weight `1 + w`) and a
//!   product with `mm_input_projection_weight` `(vision hidden, text hidden)`.
//!
//! The soft tokens come out as the projector leaves them: mlx-vlm divides
//! them by `sqrt(hidden)` before its text model multiplies every input
//! embedding by it again, which is the caller's business when it places them.

use std::path::Path;

use mlx_rs::fast::{rms_norm, scaled_dot_product_attention};
use mlx_rs::ops::{addmm, matmul};
use mlx_rs::transforms::eval;
use mlx_rs::Array;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::gemma;
use crate::model::layers::{LayerNorm, Linear};
use crate::model::weights::Weights;
use crate::model::{layout_for, LoadOptions};
use crate::pixels::preprocess_image;

/// mlx-vlm's `post_layernorm` is an `nn.LayerNorm` built without the
/// config's epsilon, so it normalizes with MLX's default (transformers'
/// SigLIP uses `layer_norm_eps` there, 1e-6 for Gemma 3); matched here.
const POST_NORM_EPS: f32 = 1e-5;

/// The shape of the vision tower and projector, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Width of the tower's hidden states.
    pub hidden_size: i32,
    /// Width of its MLPs.
    pub intermediate_size: i32,
    /// Encoder layers.
    pub num_layers: usize,
    /// Attention heads of each layer.
    pub num_heads: i32,
    /// Side of a square patch, in pixels.
    pub patch_size: i32,
    /// Side of the square image the tower reads, in pixels.
    pub image_size: i32,
    /// Epsilon of the encoder's LayerNorms and of the projector's RMS norm.
    pub layer_norm_eps: f32,
    /// Soft tokens per image (a square number).
    pub mm_tokens_per_image: i32,
    /// Width of the text model the soft tokens are projected to.
    pub text_hidden_size: i32,
}

impl VisionConfig {
    /// Reads the vision fields of a `gemma3` folder's `config.json` (at
    /// `path`): `vision_config`, `mm_tokens_per_image` (top level, else in
    /// `text_config`, else Gemma 3's 256) and the text model's width.
    pub fn from_json(config: &serde_json::Value, path: &Path) -> Result<Self> {
        let invalid = |what: String| Error::InvalidConfig {
            path: path.to_owned(),
            what,
        };
        if config.get("model_type").and_then(|v| v.as_str()) != Some("gemma3") {
            return Err(Error::UnsupportedConfig {
                path: path.to_owned(),
                what: "a vision tower outside a 'gemma3' folder".into(),
            });
        }
        let vision = config
            .get("vision_config")
            .filter(|v| v.is_object())
            .ok_or_else(|| invalid("no \"vision_config\" object".into()))?;
        let text = config.get("text_config");
        let int = |of: Option<&serde_json::Value>, name: &str| -> Option<i64> {
            of.and_then(|o| o.get(name))
                .and_then(serde_json::Value::as_i64)
        };
        let need = |name: &str| -> Result<i32> {
            int(Some(vision), name)
                .map(|n| n as i32)
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    invalid(format!(
                        "vision_config.{name} is missing or not a positive integer"
                    ))
                })
        };
        let c = Self {
            hidden_size: need("hidden_size")?,
            intermediate_size: need("intermediate_size")?,
            num_layers: need("num_hidden_layers")? as usize,
            num_heads: need("num_attention_heads")?,
            patch_size: need("patch_size")?,
            image_size: int(Some(vision), "image_size").map_or(224, |n| n as i32),
            layer_norm_eps: vision
                .get("layer_norm_eps")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(1e-6) as f32,
            mm_tokens_per_image: int(Some(config), "mm_tokens_per_image")
                .or_else(|| int(text, "mm_tokens_per_image"))
                .map_or(256, |n| n as i32),
            text_hidden_size: int(text, "hidden_size")
                .map(|n| n as i32)
                .ok_or_else(|| invalid("text_config.hidden_size is missing".into()))?,
        };
        if let Some(channels) = int(Some(vision), "num_channels").filter(|&n| n != 3) {
            return Err(Error::UnsupportedConfig {
                path: path.to_owned(),
                what: format!("a vision tower of {channels} channels (native-mlx reads RGB)"),
            });
        }
        if c.hidden_size % c.num_heads != 0 {
            return Err(invalid(format!(
                "vision_config.hidden_size {} is not a multiple of num_attention_heads {}",
                c.hidden_size, c.num_heads
            )));
        }
        let (side, tokens) = (c.patches_per_side(), c.tokens_per_side());
        if c.image_size % c.patch_size != 0
            || tokens <= 0
            || tokens * tokens != c.mm_tokens_per_image
            || side % tokens != 0
        {
            return Err(invalid(format!(
                "image_size {} in patches of {} does not pool to mm_tokens_per_image {} \
                 (a square number of tokens, each an equal square of patches)",
                c.image_size, c.patch_size, c.mm_tokens_per_image
            )));
        }
        Ok(c)
    }

    /// Patches along each side of the image.
    fn patches_per_side(&self) -> i32 {
        self.image_size / self.patch_size
    }

    /// Soft tokens along each side of the pooled grid.
    fn tokens_per_side(&self) -> i32 {
        (self.mm_tokens_per_image as f64).sqrt().round() as i32
    }
}

/// One pre-LN encoder layer of the tower: `norm1`, attention (`q_proj`,
/// `k_proj`, `v_proj`, `out_proj`), `norm2`, MLP (`fc1`, `fc2`).
struct EncoderLayer {
    norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// Gemma 3's vision tower and multi-modal projector, loaded: an image in,
/// its soft-token embeddings out.
pub struct VisionEncoder {
    config: VisionConfig,
    /// The patch kernel as the right operand of a product:
    /// `(patch * patch * 3, hidden)`.
    patch_rhs: Array,
    patch_bias: Array,
    /// `(patches, hidden)`.
    positions: Array,
    layers: Vec<EncoderLayer>,
    post_norm: LayerNorm,
    /// `1 + w` of the projector's RMS norm.
    soft_norm: Array,
    /// `(vision hidden, text hidden)`.
    projection: Array,
}

impl VisionEncoder {
    /// Loads the vision tower and projector of the `gemma3` folder `dir`
    /// (`vision_tower.*` and `multi_modal_projector.*`; the text model's
    /// tensors are left to [`crate::Model`]). Linear layers may be
    /// MLX-quantized as the folder's `quantization` says.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| Error::Json {
                path: path.clone(),
                source,
            })?;
        let config = VisionConfig::from_json(&json, &path)?;
        let quantization = ModelConfig::parse(&text, &path)?.quantization;
        let q = quantization.as_ref();
        let (layout, _) = layout_for(options)?;
        let mut w = Weights::load(dir)?;
        let bad = |what: String| Error::Weights {
            dir: dir.to_owned(),
            what,
        };
        let tower = "vision_tower.vision_model";
        let (p, hidden) = (config.patch_size, config.hidden_size);
        let kernel = w.take(&format!("{tower}.embeddings.patch_embedding.weight"))?;
        // MLX's layout `(out, kh, kw, in)`, or PyTorch's `(out, in, kh, kw)`
        // as a Hugging Face folder has it (mlx-vlm transposes it on load).
        let kernel = match kernel.shape() {
            [o, kh, kw, 3] if *o == hidden && *kh == p && *kw == p => kernel,
            [o, 3, kh, kw] if *o == hidden && *kh == p && *kw == p => {
                kernel.transpose_axes(&[0, 2, 3, 1])?
            }
            shape => {
                return Err(bad(format!(
                    "patch_embedding.weight has shape {shape:?}; expected \
                     [{hidden}, {p}, {p}, 3] (or PyTorch's [{hidden}, 3, {p}, {p}])"
                )))
            }
        };
        let patch_rhs = kernel
            .reshape(&[hidden, p * p * 3])?
            .transpose()?
            .contiguous()?;
        let patch_bias = w.take(&format!("{tower}.embeddings.patch_embedding.bias"))?;
        let positions = w.take(&format!("{tower}.embeddings.position_embedding.weight"))?;
        let patches = config.patches_per_side() * config.patches_per_side();
        if positions.shape() != [patches, hidden] {
            return Err(bad(format!(
                "position_embedding.weight has shape {:?}; expected [{patches}, {hidden}]",
                positions.shape()
            )));
        }
        let linear = |w: &mut Weights, name: &str| Linear::take(w, name, true, q, &layout);
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let l = format!("{tower}.encoder.layers.{i}");
            layers.push(EncoderLayer {
                norm1: LayerNorm::take(&mut w, &format!("{l}.layer_norm1"))?,
                q_proj: linear(&mut w, &format!("{l}.self_attn.q_proj"))?,
                k_proj: linear(&mut w, &format!("{l}.self_attn.k_proj"))?,
                v_proj: linear(&mut w, &format!("{l}.self_attn.v_proj"))?,
                out_proj: linear(&mut w, &format!("{l}.self_attn.out_proj"))?,
                norm2: LayerNorm::take(&mut w, &format!("{l}.layer_norm2"))?,
                fc1: linear(&mut w, &format!("{l}.mlp.fc1"))?,
                fc2: linear(&mut w, &format!("{l}.mlp.fc2"))?,
            });
        }
        let post_norm = LayerNorm::take(&mut w, &format!("{tower}.post_layernorm"))?;
        let soft_norm =
            gemma::norm_weight(&w.take("multi_modal_projector.mm_soft_emb_norm.weight")?)?;
        let projection = w.take("multi_modal_projector.mm_input_projection_weight")?;
        if projection.shape() != [hidden, config.text_hidden_size] {
            return Err(bad(format!(
                "mm_input_projection_weight has shape {:?}; expected [{hidden}, {}]",
                projection.shape(),
                config.text_hidden_size
            )));
        }
        // The text model's tensors belong to `Model`.
        w.finish(|n| n.starts_with("language_model."))?;
        let encoder = Self {
            config,
            patch_rhs,
            patch_bias,
            positions,
            layers,
            post_norm,
            soft_norm,
            projection,
        };
        eval(encoder.arrays())?;
        Ok(encoder)
    }

    /// The tower's shape.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// Every weight, to evaluate them at load.
    fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.patch_rhs, &self.patch_bias, &self.positions];
        for l in &self.layers {
            for linear in [&l.q_proj, &l.k_proj, &l.v_proj, &l.out_proj, &l.fc1, &l.fc2] {
                all.extend(linear.arrays());
            }
            for n in [&l.norm1, &l.norm2] {
                all.extend([&n.weight, &n.bias]);
            }
        }
        all.extend([&self.post_norm.weight, &self.post_norm.bias]);
        all.extend([&self.soft_norm, &self.projection]);
        all
    }

    /// The soft-token embeddings `(mm_tokens_per_image, text hidden)` of one
    /// PNG, JPEG, GIF, WebP or BMP image, evaluated, in the tower's weight type.
    pub fn image_features(&self, bytes: &[u8]) -> Result<Array> {
        let pixels = preprocess_image(bytes, self.config.image_size as u32)?;
        self.features_of_image(&pixels)
    }

    /// The soft-token embeddings, as [`VisionEncoder::image_features`]
    /// gives them, of one image's pixels as [`crate::preprocess_image`]
    /// makes them for this tower's `image_size`.
    pub fn features_of_image(&self, pixels: &[f32]) -> Result<Array> {
        let size = self.config.image_size;
        if pixels.len() != (size * size * 3) as usize {
            return Err(Error::InvalidRequest(format!(
                "{} pixel values; the vision tower reads {size}x{size} RGB images",
                pixels.len()
            )));
        }
        let pixels = Array::from_slice(pixels, &[1, size, size, 3]);
        let features = self.features_of_pixels(&pixels)?;
        let tokens = features.dim(1);
        let features = features.reshape(&[tokens, features.dim(2)])?;
        eval([&features])?;
        Ok(features)
    }

    /// The soft tokens `(images, mm_tokens_per_image, text hidden)` of
    /// preprocessed pixels `(images, size, size, 3)` (what
    /// [`crate::preprocess_image`] gives, one image after another). Lazy.
    pub fn features_of_pixels(&self, pixels: &Array) -> Result<Array> {
        let c = &self.config;
        let (size, p, hidden) = (c.image_size, c.patch_size, c.hidden_size);
        let images = pixels.dim(0);
        if pixels.shape() != [images, size, size, 3] {
            return Err(Error::InvalidRequest(format!(
                "pixels of shape {:?}; the vision tower reads [images, {size}, {size}, 3]",
                pixels.shape()
            )));
        }
        let dtype = self.patch_rhs.dtype();
        let side = c.patches_per_side();
        // Each patch's pixels in (row, column, channel) order, the kernel's.
        let patches = pixels
            .as_dtype(dtype)?
            .reshape(&[images, side, p, side, p, 3])?
            .transpose_axes(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[images, side * side, p * p * 3])?;
        let mut x =
            addmm(&self.patch_bias, &patches, &self.patch_rhs, None, None)?.add(&self.positions)?;
        let heads = c.num_heads;
        let head_dim = hidden / heads;
        let scale = (head_dim as f32).powf(-0.5);
        let tokens = side * side;
        let split = |t: Array| -> Result<Array> {
            Ok(t.reshape(&[images, tokens, heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        for layer in &self.layers {
            let h = layer.norm1.apply(&x, c.layer_norm_eps)?;
            let q = split(layer.q_proj.forward(&h)?)?;
            let k = split(layer.k_proj.forward(&h)?)?;
            let v = split(layer.v_proj.forward(&h)?)?;
            let a = scaled_dot_product_attention(q, k, v, scale, None, None)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[images, tokens, hidden])?;
            x = layer.out_proj.forward_plus(&a, Some(&x))?;
            let h = layer.norm2.apply(&x, c.layer_norm_eps)?;
            let m = gemma::gelu_approx(&layer.fc1.forward(&h)?)?;
            x = layer.fc2.forward_plus(&m, Some(&x))?;
        }
        let x = self.post_norm.apply(&x, POST_NORM_EPS)?;
        // Average pooling of the patch grid in windows of `k x k` patches.
        let t = c.tokens_per_side();
        let k = side / t;
        let pooled = x
            .reshape(&[images, t, k, t, k, hidden])?
            .transpose_axes(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[images, t, t, k * k, hidden])?
            .mean_axis(3, None)?
            .reshape(&[images, t * t, hidden])?;
        let normed = rms_norm(&pooled, Some(&self.soft_norm), c.layer_norm_eps)?;
        let projected = matmul(&normed, &self.projection)?;
        Ok(if projected.dtype() == x.dtype() {
            projected
        } else {
            projected.as_dtype(x.dtype())?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<VisionConfig> {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        VisionConfig::from_json(&value, Path::new("config.json"))
    }

    const TOWER: &str = r#""hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14"#;

    #[test]
    fn gemma3s_vision_fields_are_read_with_its_defaults() {
        let c = parse(&format!(
            r#"{{"model_type": "gemma3", "text_config": {{"hidden_size": 2560}},
                "vision_config": {{{TOWER}, "image_size": 896}}}}"#
        ))
        .unwrap();
        // 64 patches a side pool by 4 into 16 x 16 = 256 soft tokens.
        assert_eq!(
            (c.mm_tokens_per_image, c.text_hidden_size, c.layer_norm_eps),
            (256, 2560, 1e-6)
        );
        assert_eq!((c.patches_per_side(), c.tokens_per_side()), (64, 16));
    }

    #[test]
    fn a_grid_that_does_not_pool_evenly_is_refused() {
        // 224 / 14 = 16 patches a side do not pool into 3 x 3 tokens.
        let err = parse(&format!(
            r#"{{"model_type": "gemma3", "mm_tokens_per_image": 9,
                "text_config": {{"hidden_size": 64}}, "vision_config": {{{TOWER}}}}}"#
        ))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("does not pool"), "{err}");
        let err = parse(r#"{"model_type": "gemma3", "text_config": {"hidden_size": 64}}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("vision_config"), "{err}");
    }
}
