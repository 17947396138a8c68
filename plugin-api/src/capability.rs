//! Capability ids: features an engine has only from some version on.
//!
//! A manifest maps capability ids to engine-version requirements. The ids
//! below are the ones Hangar itself knows how to configure; a plugin may
//! declare others (lowercase `snake_case`), which the host shows but never
//! maps to settings on its own.

/// KV cache quantization (int8 and similar cache types).
pub const KV_CACHE_QUANTIZATION: &str = "kv_cache_quantization";
/// Paged attention / paged decode storage.
pub const PAGED_ATTENTION: &str = "paged_attention";
/// Reusing computed prompt prefixes across requests.
pub const PROMPT_CACHE: &str = "prompt_cache";
/// Automatic prefix caching with block-level controls.
pub const APC: &str = "apc";
/// A per-request or per-session budget of reasoning tokens.
pub const REASONING_BUDGET: &str = "reasoning_budget";
/// OpenAI's `reasoning_effort` chat request field (`low`, `medium`,
/// `high`). Added in 1.x.
pub const REASONING_EFFORT: &str = "reasoning_effort";
/// Audio parts in chat messages (OpenAI's `input_audio` content parts).
pub const AUDIO_INPUT: &str = "audio_input";
/// Tensor parallelism across local devices.
pub const TENSOR_PARALLEL: &str = "tensor_parallel";
/// Pipeline serving of one model across several machines.
pub const DISTRIBUTED_PIPELINE: &str = "distributed_pipeline";
/// Tensor-parallel serving of one model across several machines (each
/// rank holds a slice of every layer), through the engine's own
/// distributed runtime.
pub const DISTRIBUTED_TENSOR: &str = "distributed_tensor";
/// Classic speculative decoding with a draft model.
pub const SPECULATIVE: &str = "speculative";
/// Speculative decoding with multi-token-prediction drafters.
pub const SPECULATIVE_MTP: &str = "speculative_mtp";
/// Speculative decoding with DFlash block drafters.
pub const SPECULATIVE_DFLASH: &str = "speculative_dflash";

/// Tool calling: the engine renders a chat request's `tools` (and the
/// assistant's `tool_calls` and `tool` messages of its history) through
/// the model's chat template. The host parses the calls in the answer;
/// without this capability a request with `tools` is refused. Added in 1.x.
pub const TOOL_CALLS: &str = "tool_calls";
/// Structured output: the engine constrains generation to a grammar, so
/// that `response_format` (`json_object`, `json_schema`) and a forced tool
/// choice (`required`, a named function; Anthropic's `any`, `tool`) are
/// enforced. Without it such a request is refused, never answered
/// unconstrained. Added in 1.x.
pub const STRUCTURED_OUTPUT: &str = "structured_output";

/// Embeddings: the engine computes vectors for embedding models
/// (`/v1/embeddings`, Ollama's `/api/embed`). An in-process engine answers
/// [`crate::wire::EmbedRequest`]s; an engine process serves OpenAI's
/// `/v1/embeddings`. Added in 1.4.
pub const EMBEDDINGS: &str = "embeddings";
/// Reranking: the engine scores documents against a query with a
/// cross-encoder (`/v1/rerank`). An in-process engine answers
/// [`crate::wire::RerankRequest`]s; an engine process serves the
/// Jina/Cohere `/v1/rerank` shape. Added in 1.4.
pub const RERANK: &str = "rerank";

/// Lists of prompts: a completion's `prompt` given as several prompts, or
/// as token ids, which the engine answers itself (one choice per prompt).
/// Without it the host takes a prompt only as text (a list of one string
/// is sent as that string) and refuses the rest. Added in 1.6.
pub const PROMPT_LISTS: &str = "prompt_lists";

/// Images in chat messages: OpenAI `image_url` content parts, each a
/// `data:image/...;base64,` URL (the host turns Anthropic's image blocks,
/// the Responses API's `input_image` parts and Ollama's `images` into
/// these). Only models whose folder carries vision weights take images;
/// without this capability the engine is sent none. Added in 1.7.
pub const VISION: &str = "vision";

/// Every capability id Hangar knows.
pub const KNOWN: &[&str] = &[
    KV_CACHE_QUANTIZATION,
    PAGED_ATTENTION,
    PROMPT_CACHE,
    APC,
    REASONING_BUDGET,
    REASONING_EFFORT,
    AUDIO_INPUT,
    TENSOR_PARALLEL,
    DISTRIBUTED_PIPELINE,
    DISTRIBUTED_TENSOR,
    SPECULATIVE,
    SPECULATIVE_MTP,
    SPECULATIVE_DFLASH,
    TOOL_CALLS,
    STRUCTURED_OUTPUT,
    EMBEDDINGS,
    RERANK,
    PROMPT_LISTS,
    VISION,
];

/// Whether `id` is a well-formed capability id: lowercase ASCII letters,
/// digits and underscores, starting with a letter.
pub fn is_valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
