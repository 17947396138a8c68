//! Hangar's in-process MLX inference engine core, on mlx-rs.
//!
//! It loads a Hugging Face / MLX model folder (Llama 2/3, Mistral, Qwen2/2.5,
//! Qwen3; float32, float16, bfloat16 or MLX 4/8-bit quantized safetensors),
//! renders chat templates as transformers does, and generates with a KV
//! cache, seeded sampling, stop strings and prompt-prefix reuse. Greedy
//! outputs are the same token ids as mlx-lm's on the same MLX.
//!
//! ```no_run
//! use std::ops::ControlFlow;
//! use hangar_native_mlx::{ChatMessage, ChatOptions, GenerateRequest, Prompt, Session};
//!
//! let mut session = Session::load("models/qwen2.5-0.5b-4bit".as_ref())?;
//! let prompt = Prompt::Chat {
//!     messages: vec![ChatMessage::new("user", "Hello!")],
//!     options: ChatOptions::default(),
//! };
//! let done = session.generate(&GenerateRequest::new(prompt, 64), |event| {
//!     print!("{}", event.text);
//!     ControlFlow::Continue(())
//! })?;
//! println!("\n{:?}: {:?}", done.finish_reason, done.usage);
//! # Ok::<(), hangar_native_mlx::Error>(())
//! ```
//!
//! Building needs MLX 0.32.4 (the `mlx-cpu` or `mlx-cuda-13` wheel on Linux)
//! and the patched `mlx-sys` that `scripts/native-mlx-prepare.sh` prepares;
//! see this crate's README.

mod batch;
mod cache;
mod chat;
mod config;
mod constraint;
mod disk;
mod draft;
mod embed;
mod error;
mod ffi;
mod images;
mod indexing;
mod model;
mod mtp;
mod paged;
mod pixels;
mod plugin;
mod pool;
mod prefix;
mod probe;
mod qmv;
mod sampling;
mod session;
mod specprefill;
mod speculate;
mod tokenizer;
mod turn;

pub use batch::{BatchOptions, Batcher, StepStats, MERGE_PADDING_GPU};
pub use chat::{ChatMessage, ChatOptions, ChatTemplate, Content, ContentPart, ImageData};
pub use config::{
    ExpertActivation, Family, ModelConfig, MoeConfig, QuantMode, QuantParams, Quantization,
    RopeScaling, Routing, SlidingWindow, SUPPORTED_MODEL_TYPES,
};
pub use draft::{DraftLoad, Drafter};
pub use embed::{model_kind, Answer, Embedder, ModelKind, Pooling};
pub use error::{Error, Result};
pub use model::vision::{VisionConfig, VisionEncoder};
pub use model::{LoadOptions, Model};
pub use paged::check as check_paged_attention;
pub use pixels::preprocess_image;
pub use probe::{probe, DeviceKind, MlxProbe};
pub use qmv::{check_gather_qmv, check_qmv, GatherShape, QmvCheck, QmvShape};
pub use sampling::SamplingParams;
pub use session::{
    Completion, DrawScore, FinishReason, GenerateRequest, Prompt, Session, Timings, TokenEvent,
    TokenScore, Usage,
};
pub use specprefill::SpecPrefill;
pub use speculate::{SpecUsage, Speculation, MAX_K};
pub use tokenizer::{StreamDecoder, Tokenizer};
pub use turn::mlx_turn;
