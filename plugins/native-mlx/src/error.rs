//! The one error type of the engine core: what went wrong, with what, and what to do.

use std::path::PathBuf;

use crate::config::SUPPORTED_MODEL_TYPES;

/// Everything that can fail while loading a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file of the model folder is malformed.
    #[error("{path} is not valid JSON for this purpose: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// `config.json` names an architecture this engine does not implement.
    #[error(
        "model type '{model_type}' in {path} is not supported by native-mlx; supported model types: {}",
        SUPPORTED_MODEL_TYPES.join(", ")
    )]
    UnsupportedModelType {
        /// The `model_type` found.
        model_type: String,
        /// The `config.json` it came from.
        path: PathBuf,
    },
    /// `config.json` asks for a feature this engine does not implement.
    #[error("{path}: {what} is not supported by native-mlx")]
    UnsupportedConfig {
        /// The `config.json`.
        path: PathBuf,
        /// The unsupported setting, in words.
        what: String,
    },
    /// `config.json` is missing a field or has an impossible value.
    #[error("{path}: {what}")]
    InvalidConfig {
        /// The `config.json`.
        path: PathBuf,
        /// What is wrong, in words.
        what: String,
    },
    /// The safetensors weights are missing, unreadable or of the wrong shape.
    #[error("weights of {dir}: {what}")]
    Weights {
        /// The model folder.
        dir: PathBuf,
        /// What is wrong, in words.
        what: String,
    },
    /// The tokenizer could not be loaded or used.
    #[error("tokenizer of {dir}: {what}")]
    Tokenizer {
        /// The model folder.
        dir: PathBuf,
        /// What is wrong, in words.
        what: String,
    },
    /// The chat template failed to compile or render (including the
    /// template's own `raise_exception`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A chat request reached a model that has no chat template.
    #[error("model {dir} has no chat template (tokenizer_config.json or chat_template.jinja); send a plain prompt instead")]
    NoChatTemplate {
        /// The model folder.
        dir: PathBuf,
    },
    /// The request itself is malformed (empty prompt, bad sampling values…).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// An image of a request cannot be decoded (not PNG, JPEG, GIF, WebP or
    /// BMP, truncated, corrupt) or has no pixels.
    #[error("image: {0}; send a PNG, JPEG, GIF, WebP or BMP image")]
    Image(String),
    /// The engine thread that serves batched requests is gone (it failed
    /// on an earlier step, or the engine is being unloaded).
    #[error("the engine stopped: {0}; reload the model")]
    EngineStopped(String),
    /// MLX reported an error while building or evaluating a graph.
    #[error("MLX: {}", .0.what())]
    Mlx(#[from] mlx_rs::error::Exception),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
