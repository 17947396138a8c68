//! Embedding and reranking models: which kind a model folder is, and the vectors and scores they compute.
//!
//! The kind follows the host's rules (the catalog uses the same ones):
//! `architectures[0]` ending in `ForSequenceClassification` is a reranker
//! (a cross-encoder); else a sentence-transformers `modules.json` with a
//! `Pooling` module, or an encoder `model_type` (`bert`, `roberta`,
//! `xlm-roberta`), is an embedder; anything else is a chat model.

use std::path::{Path, PathBuf};

use mlx_rs::transforms::eval;
use mlx_rs::{with_stream, Array, Dtype};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::ffi::SendStream;
use crate::model::encoder::{Encoder, EncoderConfig};
use crate::model::{LoadOptions, Model};
use crate::tokenizer::{read_json, Tokenizer};
use crate::turn::mlx_turn;

/// How a model folder serves: by generating text, embedding, or reranking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A chat / completion model.
    Chat,
    /// An embedding model.
    Embedder,
    /// A cross-encoder that scores (query, document) pairs.
    Reranker,
}

/// How an embedder turns token states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean over the input's tokens.
    Mean,
    /// The last token's state (decoder embedders).
    Last,
}

impl Pooling {
    /// The id the plugin contract uses (`cls`, `mean`, `last`).
    pub fn id(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
            Self::Last => "last",
        }
    }
}

const ENCODER_TYPES: [&str; 4] = ["bert", "roberta", "xlm-roberta", "modernbert"];
const ENCODER_ARCHITECTURES: [&str; 4] = [
    "BertModel",
    "XLMRobertaModel",
    "RobertaModel",
    "ModernBertModel",
];
const POOLING_MODULE: &str = "sentence_transformers.models.Pooling";
const NORMALIZE_MODULE: &str = "sentence_transformers.models.Normalize";

fn modules(dir: &Path) -> Result<Vec<Value>> {
    Ok(match read_json(&dir.join("modules.json"))? {
        Some(Value::Array(modules)) => modules,
        _ => Vec::new(),
    })
}

fn module_of<'a>(modules: &'a [Value], kind: &str) -> Option<&'a Value> {
    modules
        .iter()
        .find(|m| m.get("type").and_then(Value::as_str) == Some(kind))
}

/// The kind of the model folder `dir` (see the module docs for the rules).
pub fn model_kind(dir: &Path) -> Result<ModelKind> {
    let path = dir.join("config.json");
    let config = read_json(&path)?.unwrap_or(Value::Null);
    let arch = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("");
    if arch.ends_with("ForSequenceClassification") {
        return Ok(ModelKind::Reranker);
    }
    if module_of(&modules(dir)?, POOLING_MODULE).is_some() {
        return Ok(ModelKind::Embedder);
    }
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if ENCODER_TYPES.contains(&model_type) || ENCODER_ARCHITECTURES.contains(&arch) {
        return Ok(ModelKind::Embedder);
    }
    Ok(ModelKind::Chat)
}

/// The network behind an embedder or reranker.
// One per embedder, made once and never moved in a loop: the size of the
// larger variant (a decoder `Model`, with its config) costs nothing.
#[allow(clippy::large_enum_variant)]
enum Network {
    Encoder(Encoder),
    /// A decoder embedder (Qwen3-Embedding): last-token states, one input at a time.
    Decoder(Model),
}

/// What one embedding or rerank call answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer<T> {
    /// One result per input, in order, and the tokens read.
    Done {
        /// The vectors or scores.
        results: Vec<T>,
        /// Tokens read over every input.
        tokens: usize,
    },
    /// An input the model cannot take as sent.
    Refused {
        /// Its index.
        input: usize,
        /// Why, for the client.
        message: String,
    },
}

/// An embedding or reranking model, loaded.
pub struct Embedder {
    stream: SendStream,
    dir: PathBuf,
    name: String,
    kind: ModelKind,
    network: Network,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalized: bool,
    max_tokens: usize,
    vocab_size: usize,
}

/// Tokens one forward pass takes at most (rows times padded length): a
/// batch of 256 inputs of 64 tokens is one pass, larger requests several.
const TOKENS_PER_FORWARD: usize = 16_384;

impl Embedder {
    /// Loads the embedder or reranker of `dir`, whose kind is `kind`.
    pub fn load(dir: &Path, kind: ModelKind, options: &LoadOptions) -> Result<Self> {
        let path = dir.join("config.json");
        let config = read_json(&path)?.ok_or_else(|| Error::InvalidConfig {
            path: path.clone(),
            what: "config.json is missing".into(),
        })?;
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let arch = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("");
        let modules = modules(dir)?;
        let (mut pooling, mut normalized) = (None, true);
        if let Some(module) = module_of(&modules, POOLING_MODULE) {
            let folder = module
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("1_Pooling");
            let pooling_path = dir.join(folder).join("config.json");
            let p = read_json(&pooling_path)?.unwrap_or(Value::Null);
            let on = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
            pooling = Some(if on("pooling_mode_cls_token") {
                Pooling::Cls
            } else if on("pooling_mode_mean_tokens") {
                Pooling::Mean
            } else if on("pooling_mode_lasttoken") {
                Pooling::Last
            } else {
                return Err(Error::UnsupportedConfig {
                    path: pooling_path,
                    what: "a pooling mode other than cls, mean or lasttoken".into(),
                });
            });
            normalized = module_of(&modules, NORMALIZE_MODULE).is_some();
        }
        let st_max = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .map(|n| n as usize);
        let stream = SendStream::new(false)?;
        let _turn = mlx_turn();
        let encoder_type = ["bert", "roberta", "xlm-roberta"].contains(&model_type);
        let (network, model_max, vocab_size, eos) = if encoder_type {
            let encoder_config = EncoderConfig::from_json(&config, &path)?;
            let head = match kind {
                ModelKind::Reranker if arch.starts_with("Bert") => Some("bert"),
                ModelKind::Reranker => Some("roberta"),
                _ => None,
            };
            let encoder = with_stream(&stream.0, || {
                Encoder::load(dir, encoder_config.clone(), head, options)
            })?;
            let max = encoder_config.max_tokens();
            let vocab = encoder_config.vocab_size as usize;
            (Network::Encoder(encoder), max, vocab, Vec::new())
        } else if kind == ModelKind::Embedder && pooling == Some(Pooling::Last) {
            let model_config = ModelConfig::load(dir)?;
            let max = config
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(32_768) as usize;
            let vocab = model_config.vocab_size as usize;
            let eos = model_config.eos_token_ids.clone();
            let model = with_stream(&stream.0, || Model::load(dir, model_config, options))?;
            (Network::Decoder(model), max, vocab, eos)
        } else {
            return Err(Error::UnsupportedConfig {
                path,
                what: format!(
                    "{} of model type '{model_type}' (native-mlx embeds with bert, roberta \
                     and xlm-roberta encoders and last-token decoders, and reranks with \
                     Bert/XLMRoberta ForSequenceClassification)",
                    if kind == ModelKind::Reranker {
                        "reranker"
                    } else {
                        "embedder"
                    }
                ),
            });
        };
        drop(_turn);
        let tokenizer = Tokenizer::load(dir, &eos)?;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        Ok(Self {
            stream,
            dir: dir.to_owned(),
            name,
            kind,
            network,
            tokenizer,
            // Without a sentence-transformers config an encoder is mean-pooled.
            pooling: pooling.unwrap_or(Pooling::Mean),
            normalized,
            max_tokens: st_max.map_or(model_max, |m| m.min(model_max)),
            vocab_size,
        })
    }

    /// Embedder or reranker.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// The pooling it does.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether its vectors are L2-normalised.
    pub fn normalized(&self) -> bool {
        self.normalized
    }

    /// The most tokens one input (or one rerank pair) may have.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why `ids` (input `index`) cannot be read, if it cannot.
    fn refusal(&self, index: usize, ids: &[u32]) -> Option<String> {
        let name = &self.name;
        if ids.is_empty() {
            return Some(format!(
                "input {index} has no tokens; model '{name}' needs at least one"
            ));
        }
        if ids.len() > self.max_tokens {
            return Some(format!(
                "input {index} has {} tokens; model '{name}' reads at most {}",
                ids.len(),
                self.max_tokens
            ));
        }
        ids.iter()
            .find(|&&t| t as usize >= self.vocab_size)
            .map(|t| {
                format!(
                    "input {index} has token id {t}; model '{name}' has {} ids",
                    self.vocab_size
                )
            })
    }

    /// Text as the model reads it, special tokens included.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }

    /// Embeds each of `inputs` (token ids). Longer inputs than the model
    /// reads, empty inputs and unknown ids are refused by index, never cut.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Answer<Vec<f32>>> {
        if self.kind != ModelKind::Embedder {
            return Err(Error::InvalidRequest(format!(
                "model '{}' is a reranker; it scores (query, document) pairs, it does not embed",
                self.name
            )));
        }
        if let Some((i, m)) =
            (inputs.iter().enumerate()).find_map(|(i, ids)| self.refusal(i, ids).map(|m| (i, m)))
        {
            return Ok(Answer::Refused {
                input: i,
                message: m,
            });
        }
        let mut results = Vec::with_capacity(inputs.len());
        for chunk in chunks(inputs.iter().map(Vec::len)) {
            let rows: Vec<_> = inputs[chunk]
                .iter()
                .map(|ids| (ids.clone(), None))
                .collect();
            results.extend(self.pooled(&rows)?);
        }
        if self.normalized {
            results.iter_mut().for_each(|v| normalize(v));
        }
        Ok(Answer::Done {
            results,
            tokens: inputs.iter().map(Vec::len).sum(),
        })
    }

    /// The pooled vectors of one forward's rows.
    fn pooled(&self, rows: &[(Vec<u32>, Option<Vec<u32>>)]) -> Result<Vec<Vec<f32>>> {
        let _turn = mlx_turn();
        with_stream(&self.stream.0, || match &self.network {
            Network::Encoder(encoder) => {
                let batch = encoder.batch(rows);
                let h = encoder.forward(&batch)?;
                let pooled = pool(&h, &batch.lens, batch.width, self.pooling)?;
                to_rows(&pooled)
            }
            Network::Decoder(model) => rows
                .iter()
                .map(|(ids, _)| {
                    let ids = ids.iter().map(|&t| t as i32).collect::<Vec<_>>();
                    let len = ids.len() as i32;
                    let h = model.normed_hidden(&Array::from_slice(&ids, &[1, len]))?;
                    let last = h
                        .reshape(&[len, -1])?
                        .take_axis(Array::from_int(len - 1), 0)?;
                    Ok(to_rows(&last.reshape(&[1, -1])?)?.remove(0))
                })
                .collect(),
        })
    }

    /// Scores each document against `query` with the cross-encoder.
    pub fn rerank(&self, query: &str, documents: &[String]) -> Result<Answer<f32>> {
        let Network::Encoder(encoder) = &self.network else {
            return Err(self.not_a_reranker());
        };
        if self.kind != ModelKind::Reranker {
            return Err(self.not_a_reranker());
        }
        let mut pairs = Vec::with_capacity(documents.len());
        for (i, doc) in documents.iter().enumerate() {
            let (ids, types) = self.tokenizer.encode_pair(query, doc)?;
            if let Some(message) = self.refusal(i, &ids) {
                let message = message.replacen("input", "document", 1);
                return Ok(Answer::Refused { input: i, message });
            }
            pairs.push((ids, Some(types)));
        }
        let mut results = Vec::with_capacity(pairs.len());
        for chunk in chunks(pairs.iter().map(|(ids, _)| ids.len())) {
            let rows = &pairs[chunk];
            let _turn = mlx_turn();
            let scores = with_stream(&self.stream.0, || -> Result<Vec<Vec<f32>>> {
                let batch = encoder.batch(rows);
                let h = encoder.forward(&batch)?;
                let first = pool(&h, &batch.lens, batch.width, Pooling::Cls)?;
                let scores = encoder
                    .classify(&first)
                    .unwrap_or_else(|| Err(self.not_a_reranker()))?;
                to_rows(&scores)
            })?;
            results.extend(scores.into_iter().map(|s| s[0]));
        }
        Ok(Answer::Done {
            results,
            tokens: pairs.iter().map(|(ids, _)| ids.len()).sum(),
        })
    }

    fn not_a_reranker(&self) -> Error {
        Error::InvalidRequest(format!(
            "model '{}' is an embedding model; it embeds, it does not rerank",
            self.name
        ))
    }
}

/// Consecutive ranges of inputs (of the given lengths) whose padded batch
/// stays within [`TOKENS_PER_FORWARD`].
fn chunks(lens: impl Iterator<Item = usize>) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut widest, mut end) = (0, 0, 0);
    for (i, len) in lens.enumerate() {
        let wider = widest.max(len);
        if i > start && wider * (i + 1 - start) > TOKENS_PER_FORWARD {
            out.push(start..i);
            (start, widest) = (i, len);
        } else {
            widest = wider;
        }
        end = i + 1;
    }
    if end > start {
        out.push(start..end);
    }
    out
}

/// Pools `h` `(batch, width, hidden)` row by row over each row's real tokens.
fn pool(h: &Array, lens: &[usize], width: usize, pooling: Pooling) -> Result<Array> {
    let (rows, width_i) = (lens.len() as i32, width as i32);
    Ok(match pooling {
        Pooling::Cls | Pooling::Last => {
            let index: Vec<i32> = lens
                .iter()
                .enumerate()
                .map(|(r, &n)| {
                    r as i32 * width_i
                        + if pooling == Pooling::Cls {
                            0
                        } else {
                            n as i32 - 1
                        }
                })
                .collect();
            h.reshape(&[rows * width_i, -1])?
                .take_axis(Array::from_slice(&index, &[rows]), 0)?
        }
        Pooling::Mean => {
            let mask: Vec<f32> = lens
                .iter()
                .flat_map(|&n| (0..width).map(move |i| if i < n { 1.0 } else { 0.0 }))
                .collect();
            let mask = Array::from_slice(&mask, &[rows, width_i, 1]);
            let counts: Vec<f32> = lens.iter().map(|&n| n as f32).collect();
            let counts = Array::from_slice(&counts, &[rows, 1]);
            h.as_dtype(Dtype::Float32)?
                .multiply(&mask)?
                .sum_axis(1, None)?
                .divide(&counts)?
        }
    })
}

/// The rows of a `(rows, dim)` array as float32 vectors (evaluates it).
fn to_rows(a: &Array) -> Result<Vec<Vec<f32>>> {
    let a = a.as_dtype(Dtype::Float32)?;
    eval([&a])?;
    let dim = a.dim(-1) as usize;
    Ok(a.as_slice::<f32>()
        .chunks(dim)
        .map(<[f32]>::to_vec)
        .collect())
}

/// L2-normalises `v` as sentence-transformers' `Normalize` does (`x / max(|x|, 1e-12)`).
fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let norm = norm.max(1e-12) as f32;
    v.iter_mut().for_each(|x| *x /= norm);
}
