//! Images in chat prompts (Gemma 3): where an image's soft tokens go in the prompt, what identifies an image to the prefix cache, and its soft-token embeddings, cached by content.
//!
//! As mlx-vlm 0.7.6 serves a `gemma3` folder (its `Gemma3Processor` and
//! `Model.get_input_embeddings`):
//!
//! - the chat template writes `<start_of_image>` where an image part is;
//!   every occurrence in the rendered text becomes `\n\n<start_of_image>`,
//!   `mm_tokens_per_image` × `<image_soft_token>`, `<end_of_image>\n\n`,
//!   and the whole text is tokenized;
//! - the soft tokens' embeddings are the vision tower's features of the
//!   image divided by `sqrt(hidden_size)` (in the features' type), in place
//!   of the embeddings of the `<image_soft_token>` id; the text model then
//!   multiplies every embedding by its scale, `sqrt(hidden)` in bfloat16;
//! - attention stays causal over the whole prompt, images included (the
//!   4-D mask mlx-vlm builds for its images never reaches the text model).
//!
//! The `hidden_size` of the division is the top level's of `config.json`
//! where it has one, as mlx-vlm reads it; Google's folders have none, and
//! there mlx-vlm assumes 2048, which scales every soft token by
//! `sqrt(text hidden / 2048)` (1.12 for Gemma 3 4B, 1.62 for 27B) against
//! transformers, whose soft tokens bypass the embedding scale. native-mlx
//! divides by the text model's width there, which cancels the scale as
//! transformers computes it (up to its bfloat16 rounding, as mlx-vlm does
//! with a matching `hidden_size`).

use std::path::Path;

use mlx_rs::transforms::eval;
use mlx_rs::Array;
use sha2::{Digest, Sha256};

use crate::chat::ImageData;
use crate::error::{Error, Result};
use crate::model::vision::VisionEncoder;
use crate::model::LoadOptions;
use crate::pixels::preprocess_image;
use crate::tokenizer::{read_json, Tokenizer};

/// mlx-vlm's `image_token_index` where `config.json` names none.
const DEFAULT_IMAGE_TOKEN: u32 = 262_144;

/// Bytes of soft-token embeddings kept for images seen lately (a Gemma 3
/// 27B image's are 2.75 MB in bfloat16).
const FEATURE_CACHE_BYTES: usize = 64 << 20;

/// An image's identity: the SHA-256 of its file's bytes.
pub(crate) type ImageDigest = [u8; 32];

/// One image of a prompt: its soft tokens' place and its file.
#[derive(Debug, Clone)]
pub(crate) struct PromptImage {
    /// Index of its first soft token in the prompt.
    pub(crate) start: usize,
    /// How many soft tokens it has.
    pub(crate) len: usize,
    pub(crate) digest: ImageDigest,
    pub(crate) image: ImageData,
}

/// A prompt's token ids and where its images' soft tokens are.
#[derive(Debug, Clone, Default)]
pub(crate) struct PromptInput {
    pub(crate) tokens: Vec<u32>,
    /// In prompt order, not overlapping.
    pub(crate) images: Vec<PromptImage>,
}

impl PromptInput {
    /// A prompt of text alone.
    pub(crate) fn text(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            images: Vec::new(),
        }
    }

    /// What the prefix cache keys the prompt's blocks by: its token ids,
    /// except that an image's soft tokens (all the same id) are words of
    /// the image's digest with the top bit set, which no token id has. A
    /// block of an image's soft tokens is then another block for another
    /// image (its chained hash and its stored tokens differ), and the same
    /// block for the same image after the same text.
    pub(crate) fn cache_keys(&self) -> Option<Vec<u32>> {
        if self.images.is_empty() {
            return None;
        }
        let mut keys = self.tokens.clone();
        for image in &self.images {
            let words: Vec<u32> = image
                .digest
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            for (i, key) in keys[image.start..image.start + image.len]
                .iter_mut()
                .enumerate()
            {
                *key = 0x8000_0000 | words[i % words.len()];
            }
        }
        Some(keys)
    }
}

/// The digest of an image's bytes.
pub(crate) fn digest(bytes: &[u8]) -> ImageDigest {
    Sha256::digest(bytes).into()
}

/// Why a model reads no images.
#[derive(Debug, Clone)]
pub(crate) struct NoVision {
    /// In words, to answer a request with images.
    pub(crate) reason: String,
    /// The folder has a vision tower that did not load (the operator
    /// should hear of it at load), rather than none.
    pub(crate) broken: bool,
}

/// A Gemma 3 folder's vision: its tower and projector, how its prompts
/// place images, and the soft tokens of recent images.
pub(crate) struct Vision {
    encoder: VisionEncoder,
    /// What the chat template writes for an image (`<start_of_image>`).
    placeholder: String,
    /// What the processor writes in its place.
    expansion: String,
    soft_token: u32,
    per_image: usize,
    /// `sqrt(hidden_size)`, which the features are divided by.
    divisor: f32,
    cache: FeatureCache,
}

impl Vision {
    /// The vision of model folder `dir`, whose text model and tokenizer are
    /// loaded: `Err` says why images are refused (a family other than
    /// `gemma3`, a folder without a vision tower, or one that fails to load).
    pub(crate) fn load(
        dir: &Path,
        tokenizer: &Tokenizer,
        options: &LoadOptions,
    ) -> std::result::Result<Self, NoVision> {
        let absent = |reason: String| NoVision {
            reason,
            broken: false,
        };
        let broken = |e: String| NoVision {
            reason: format!("its vision tower does not load: {e}"),
            broken: true,
        };
        let path = dir.join("config.json");
        let config = read_json(&path)
            .map_err(|e| broken(e.to_string()))?
            .unwrap_or_default();
        let model_type = config.get("model_type").and_then(|t| t.as_str());
        let gemma3 = "only Gemma 3 reads images here (model type 'gemma3' with its vision tower)";
        if model_type != Some("gemma3") {
            return Err(absent(format!(
                "model type '{}' has no vision in native-mlx: {gemma3}",
                model_type.unwrap_or("?")
            )));
        }
        // A `gemma3` folder whose vision_config is a stub, or whose
        // converter left the tower out, serves text.
        let has_tower = config
            .get("vision_config")
            .is_some_and(|v| v.get("num_hidden_layers").is_some());
        if !has_tower {
            return Err(absent(
                "its config.json has no vision tower (a vision_config with its layers)".into(),
            ));
        }
        let encoder = VisionEncoder::load(dir, options).map_err(|e| broken(e.to_string()))?;
        let token = |key: &str, name: &str| -> std::result::Result<(u32, String), NoVision> {
            let id = config
                .get(key)
                .and_then(|v| v.as_u64())
                .map(|id| id as u32)
                .or_else(|| tokenizer.token_to_id(name))
                .or((key == "image_token_index").then_some(DEFAULT_IMAGE_TOKEN))
                .ok_or_else(|| broken(format!("no {key}, and no {name} token")))?;
            let text = tokenizer
                .inner()
                .id_to_token(id)
                .ok_or_else(|| broken(format!("{key} {id} is not a token of the tokenizer")))?;
            Ok((id, text))
        };
        let (_, boi) = token("boi_token_index", "<start_of_image>")?;
        let (_, eoi) = token("eoi_token_index", "<end_of_image>")?;
        let (soft_token, soft) = token("image_token_index", "<image_soft_token>")?;
        let per_image = encoder.config().mm_tokens_per_image as usize;
        let expansion = format!("\n\n{boi}{}{eoi}\n\n", soft.repeat(per_image));
        // Each soft token must be one token, or the features would not fit.
        let ids = tokenizer
            .encode(&expansion, false)
            .map_err(|e| broken(e.to_string()))?;
        let found = ids.iter().filter(|&&id| id == soft_token).count();
        if found != per_image {
            return Err(broken(format!(
                "the tokenizer reads {per_image} × '{soft}' as {found} image tokens"
            )));
        }
        let divisor = soft_token_divisor(&config, encoder.config().text_hidden_size);
        Ok(Self {
            encoder,
            placeholder: boi,
            expansion,
            soft_token,
            per_image,
            divisor,
            cache: FeatureCache::default(),
        })
    }

    /// Expands the images of a rendered chat prompt and tokenizes it:
    /// `images` are the messages' images in order, one for each
    /// placeholder the template wrote.
    pub(crate) fn expand(
        &self,
        text: &str,
        images: Vec<ImageData>,
        tokenizer: &Tokenizer,
    ) -> Result<PromptInput> {
        let placed = text.matches(self.placeholder.as_str()).count();
        if placed != images.len() {
            return Err(Error::InvalidRequest(format!(
                "the request has {} image(s) but the rendered chat template has {placed} \
                 '{}' where images go (an image in a message the template leaves out, such \
                 as a system message, or that text typed in a message); send images in \
                 user messages",
                images.len(),
                self.placeholder
            )));
        }
        let tokens = tokenizer.encode(&text.replace(&self.placeholder, &self.expansion), false)?;
        let mut spans = Vec::new();
        let mut at = 0;
        while at < tokens.len() {
            if tokens[at] != self.soft_token {
                at += 1;
                continue;
            }
            let start = at;
            while at < tokens.len() && tokens[at] == self.soft_token {
                at += 1;
            }
            spans.push((start, at - start));
        }
        let whole = spans.iter().all(|&(_, len)| len == self.per_image);
        if spans.len() != images.len() || !whole {
            return Err(Error::InvalidRequest(format!(
                "the prompt's image tokens do not make {} image(s) of {} (image token text \
                 typed in a message?)",
                images.len(),
                self.per_image
            )));
        }
        let images = spans
            .into_iter()
            .zip(images)
            .map(|((start, len), image)| PromptImage {
                start,
                len,
                digest: digest(&image.bytes),
                image,
            })
            .collect();
        Ok(PromptInput { tokens, images })
    }

    /// The side of the square images the tower reads.
    pub(crate) fn image_size(&self) -> u32 {
        self.encoder.config().image_size as u32
    }

    /// The soft-token embeddings `(tokens, text hidden)` of `image` (the
    /// `index`th of its request, for errors), divided by `sqrt(hidden)`,
    /// evaluated: from the cache, or computed (from `pixels` where the
    /// caller prepared them, see [`prepare_pixels`]) and kept.
    pub(crate) fn soft_tokens(
        &mut self,
        image: &PromptImage,
        index: usize,
        pixels: Option<&[f32]>,
    ) -> Result<Array> {
        if let Some(features) = self.cache.get(&image.digest) {
            return Ok(features);
        }
        let features = match pixels {
            Some(pixels) => self.encoder.features_of_image(pixels),
            None => self
                .encoder
                .image_features(&image.image.bytes)
                .map_err(|e| in_request(e, index)),
        }?;
        // mlx-vlm's `image_features / (hidden_size**0.5)`: a Python float,
        // taken in the features' type.
        let divisor = Array::from_f32(self.divisor).as_dtype(features.dtype())?;
        let soft = features.divide(&divisor)?;
        eval([&soft])?;
        self.cache.put(image.digest, soft.clone());
        Ok(soft)
    }
}

/// An image error, saying which image of its request it is about.
fn in_request(e: Error, index: usize) -> Error {
    match e {
        Error::Image(what) => Error::Image(format!("image {} of the request: {what}", index + 1)),
        other => other,
    }
}

/// The pixel values of each distinct image of `prompt` for a tower of
/// `size` (decoded and resized as `preprocess_image` does), by digest: the
/// CPU's work on an image, done by the caller's thread before the request
/// reaches the engine's, so that the others' steps do not wait for it. An
/// image that does not decode is its request's error.
pub(crate) fn prepare_pixels(
    prompt: &crate::Prompt,
    size: u32,
) -> Result<Vec<(ImageDigest, Vec<f32>)>> {
    let crate::Prompt::Chat { messages, .. } = prompt else {
        return Ok(Vec::new());
    };
    let mut prepared: Vec<(ImageDigest, Vec<f32>)> = Vec::new();
    for (index, image) in messages.iter().flat_map(|m| m.images()).enumerate() {
        let digest = digest(&image.bytes);
        if prepared.iter().all(|(d, _)| *d != digest) {
            let pixels = preprocess_image(&image.bytes, size).map_err(|e| in_request(e, index))?;
            prepared.push((digest, pixels));
        }
    }
    Ok(prepared)
}

/// What the soft tokens are divided by: `sqrt` of the top level's
/// `hidden_size` of `config.json`, as mlx-vlm reads it, else of the text
/// model's width (where mlx-vlm would take 2048; see the module's docs).
fn soft_token_divisor(config: &serde_json::Value, text_hidden: i32) -> f32 {
    let hidden = config
        .get("hidden_size")
        .and_then(|h| h.as_u64())
        .map_or(text_hidden as f64, |h| h as f64);
    hidden.sqrt() as f32
}

/// Soft tokens of recent images by digest, least recently used out first.
#[derive(Default)]
struct FeatureCache {
    entries: Vec<(ImageDigest, Array, u64)>,
    clock: u64,
}

impl FeatureCache {
    fn get(&mut self, digest: &ImageDigest) -> Option<Array> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.iter_mut().find(|(d, ..)| d == digest)?;
        entry.2 = clock;
        Some(entry.1.clone())
    }

    fn put(&mut self, digest: ImageDigest, features: Array) {
        self.clock += 1;
        self.entries.push((digest, features, self.clock));
        while self
            .entries
            .iter()
            .map(|(_, a, _)| a.nbytes())
            .sum::<usize>()
            > FEATURE_CACHE_BYTES
            && self.entries.len() > 1
        {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].2)
                .expect("entries");
            self.entries.swap_remove(oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn image(start: usize, len: usize, bytes: &[u8]) -> PromptImage {
        PromptImage {
            start,
            len,
            digest: digest(bytes),
            image: ImageData {
                bytes: Arc::from(bytes),
            },
        }
    }

    #[test]
    fn cache_keys_tell_images_apart_and_leave_text_alone() {
        let tokens: Vec<u32> = [1, 2].into_iter().chain([9; 20]).chain([3]).collect();
        let a = PromptInput {
            tokens: tokens.clone(),
            images: vec![image(2, 20, b"one image")],
        };
        let b = PromptInput {
            tokens: tokens.clone(),
            images: vec![image(2, 20, b"another image")],
        };
        let (ka, kb) = (a.cache_keys().unwrap(), b.cache_keys().unwrap());
        assert_eq!((&ka[..2], ka[22]), (&tokens[..2], 3));
        assert_eq!((&kb[..2], kb[22]), (&tokens[..2], 3));
        // Every soft token carries a word of the digest, above every id.
        assert!(ka[2..22].iter().all(|&k| k >= 0x8000_0000));
        assert!(ka[2..22].iter().zip(&kb[2..22]).all(|(x, y)| x != y));
        assert_eq!(ka, a.clone().cache_keys().unwrap());
        assert_eq!(PromptInput::text(tokens).cache_keys(), None);
    }

    #[test]
    fn soft_tokens_are_divided_by_the_top_levels_width_else_the_text_models() {
        let top = serde_json::json!({"hidden_size": 2048, "text_config": {"hidden_size": 2560}});
        assert_eq!(soft_token_divisor(&top, 2560), 2048f32.sqrt());
        // Google's layout: no top-level width.
        let google = serde_json::json!({"text_config": {"hidden_size": 2560}});
        assert_eq!(soft_token_divisor(&google, 2560), 2560f32.sqrt());
    }

    #[test]
    fn the_feature_cache_keeps_recent_images_within_its_budget() {
        let mut cache = FeatureCache::default();
        // 24 MiB each: two fit in 64, a third evicts the least recent.
        let big = || Array::zeros::<f32>(&[6 << 20]).unwrap();
        let (a, b, c) = (digest(b"a"), digest(b"b"), digest(b"c"));
        cache.put(a, big());
        cache.put(b, big());
        assert!(cache.get(&a).is_some());
        cache.put(c, big());
        assert!(cache.get(&b).is_none());
        assert!(cache.get(&a).is_some() && cache.get(&c).is_some());
    }
}
