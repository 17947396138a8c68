//! A multi-token-prediction (MTP) layer: Xiaomi MiMo's `model.mtp_layers.{i}`.
//!
//! The layer guesses the token after next. At position `p` it reads the
//! model's hidden state there (before the final norm: what vLLM's
//! `MiMoModel` hands its MTP proposer) and the embedding of token `p + 1`,
//! each through its own RMS norm (`hidden_layernorm`, `token_layernorm`),
//! concatenated in that order (hidden first, as Hugging Face's
//! `MiMoMTPLayers` and vLLM's `MiMoMultiTokenPredictorLayer` do) and
//! projected back to the model's width (`input_proj`, no bias); then one
//! Qwen2 decoder block with its own attention and key/value cache, at
//! RoPE position `p`, and `final_layernorm`. The model's shared output
//! projection turns the result into logits for token `p + 2`. As in vLLM,
//! the embedding at position 0 is zeroed (the first token has no earlier
//! hidden state worth pairing it with).
//!
//! Applied recursively, the layer's own output takes the place of the
//! model's hidden state and its guess the place of the token: `k` guesses
//! from one read of the model (see `crate::mtp`).

use mlx_rs::fast::rms_norm;
use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use super::layers::{Layout, Linear};
use super::weights::Weights;
use super::{Block, Model, Rope};
use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::indexing::IndexOnStream;

/// One MTP layer's weights.
#[derive(Clone)]
pub(crate) struct MtpLayer {
    token_norm: Array,
    hidden_norm: Array,
    input_proj: Linear,
    block: Block,
    final_norm: Array,
    eps: f32,
}

impl MtpLayer {
    /// Takes the layer at `p` (`model.mtp_layers.{i}`); its block's
    /// weights lie beside its own (`self_attn.*`, `mlp.*`,
    /// `input_layernorm`, `post_attention_layernorm`).
    pub(super) fn take(
        w: &mut Weights,
        p: &str,
        config: &ModelConfig,
        l: &Layout,
        fuse: bool,
        on_cpu: bool,
    ) -> Result<Self> {
        let q = config.quantization.as_ref();
        Ok(Self {
            token_norm: w.take(&format!("{p}.token_layernorm.weight"))?,
            hidden_norm: w.take(&format!("{p}.hidden_layernorm.weight"))?,
            input_proj: Linear::take(w, &format!("{p}.input_proj"), false, q, l)?,
            // A dense Qwen2 block: no window, no experts (index 0 reads
            // neither for this family).
            block: Block::take(w, p, 0, config, l, fuse, on_cpu)?,
            final_norm: w.take(&format!("{p}.final_layernorm.weight"))?,
            eps: config.rms_norm_eps,
        })
    }

    /// The layer over `hidden` (`(1, n, width)`: the model's hidden states,
    /// or the layer's own output) and `embedded` (`(1, n, width)`: the
    /// embeddings of the tokens after them), appending to `cache`, whose
    /// next position is the first row's. Returns the final-normed output
    /// `(1, n, width)`. Lazy.
    fn forward(
        &self,
        hidden: &Array,
        embedded: &Array,
        cache: &mut KvCache,
        rope: &Rope,
    ) -> Result<Array> {
        let n = embedded.dim(1);
        let embedded = if cache.position() == 0 {
            // vLLM's `inputs_embeds[positions == 0] = 0`.
            let keep: Vec<f32> = (0..n).map(|i| if i == 0 { 0.0 } else { 1.0 }).collect();
            let keep = Array::from_slice(&keep, &[1, n, 1]).as_dtype(embedded.dtype())?;
            embedded.multiply(&keep)?
        } else {
            embedded.clone()
        };
        let e = rms_norm(&embedded, Some(&self.token_norm), self.eps)?;
        let h = rms_norm(hidden, Some(&self.hidden_norm), self.eps)?;
        let x = self.input_proj.forward(&concatenate(&[h, e], -1)?)?;
        let y = self.block.forward(&x, cache, rope)?;
        Ok(rms_norm(&y, Some(&self.final_norm), self.eps)?)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.token_norm, &self.hidden_norm, &self.final_norm];
        all.extend(self.input_proj.arrays());
        all.extend(self.block.arrays());
        all
    }
}

impl Model {
    /// How many MTP layers the checkpoint carries (0 for most; MiMo's
    /// have one, unless a converter dropped it).
    pub fn mtp_layers(&self) -> usize {
        self.mtp.len()
    }

    /// Why the model cannot propose with MTP layers, where it cannot.
    pub fn why_no_mtp(&self) -> Option<String> {
        if !self.mtp.is_empty() {
            return None;
        }
        let declared = self.config.mtp_layers;
        Some(if declared > 0 {
            format!(
                "the model has no multi-token-prediction layers: its config declares {declared} (num_nextn_predict_layers) but its weights have none (model.mtp_layers.0.*); mlx_lm.convert drops them, so convert keeping them or choose another draft_kind"
            )
        } else {
            format!(
                "the model has no multi-token-prediction layers: its family ({:?}) has none; MTP layers come with MiMo checkpoints (model_type mimo)",
                self.config.family
            )
        })
    }

    /// The first MTP layer over `hidden` (`(1, n, width)`) and the tokens
    /// after each of its rows, `next` (`(1, n)`), appending to `cache`.
    /// Returns the layer's output `(1, n, width)`, which
    /// [`Model::mtp_logits`] projects and the next recursive step reads.
    /// Lazy. Only the first layer proposes, recursively (as vLLM's MiMo
    /// proposer, which runs layer 0 alone).
    pub(crate) fn mtp_forward(
        &self,
        hidden: &Array,
        next: &Array,
        cache: &mut KvCache,
    ) -> Result<Array> {
        let layer = self.mtp.first().expect("the model has an MTP layer");
        layer.forward(hidden, &self.embedded(next)?, cache, &self.rope)
    }

    /// Logits of MTP outputs `out`: the model's shared output projection
    /// (the layer normed them already).
    pub(crate) fn mtp_logits(&self, out: &Array) -> Result<Array> {
        self.output(out)
    }

    /// The first MTP layer's logits at every position of `tokens` but the
    /// last, from empty caches: row `p` reads the model's hidden state at
    /// `p` and token `p + 1`, and scores token `p + 2`. `(n - 1) * vocab`
    /// floats, row by row. For checking the layer against a reference.
    pub fn mtp_logits_of(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        assert!(tokens.len() >= 2, "two tokens at least");
        let n = tokens.len() as i32;
        let ids = crate::session::ids(tokens)?;
        let hidden = self.hidden(&ids, &mut self.new_cache())?;
        let hidden = hidden.at((.., ..n - 1, ..))?;
        let next = ids.at((.., 1..))?;
        let out = self.mtp_forward(&hidden, &next, &mut KvCache::default())?;
        let logits = self.mtp_logits(&out)?.as_dtype(mlx_rs::Dtype::Float32)?;
        logits.eval()?;
        Ok(logits.as_slice::<f32>().to_vec())
    }
}
