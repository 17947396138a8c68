//! The messages that cross the plugin boundary.
//!
//! They are plain serde types; the native ABI carries them as JSON text
//! ([`crate::abi`]), so a 1.x minor release can add a field (always with
//! `#[serde(default)]`) without breaking plugins built against an older one.
//!
//! Nor does an addition break a plugin's *source*: every message is
//! `#[non_exhaustive]` (since 1.2), so plugins build them with constructors
//! and builders ([`LaunchPlan::new`] and its `with_*` functions,
//! [`ProbeReport::available`], [`Readiness::new`] …) and match them with
//! `..` and a wildcard arm; fields stay public to read. A struct literal
//! would stop compiling the day a field is added, as
//! `LaunchPlan { .. }` without `ranks` did when 1.1 added it.
//!
//! ```
//! use hangar_plugin_api::wire::{LaunchPlan, Readiness, WarmupRequest};
//! let plan = LaunchPlan::new("engine-server", ["--port", "8080"])
//!     .with_readiness(
//!         Readiness::new("/health")
//!             .with_warmup(WarmupRequest::new("/v1/completions", serde_json::json!({"max_tokens": 1})))
//!             .with_failed_statuses([500]),
//!     )
//!     .with_start_timeout_ms(120_000);
//! assert_eq!(plan.args, ["--port", "8080"]);
//! assert_eq!(plan.readiness.ready_status, 200);
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a plugin's code says about itself. The host compares it with the
/// manifest and refuses a plugin whose code and manifest disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Description {
    /// Must equal the manifest's `id`.
    pub id: String,
    /// Must equal the manifest's `version`.
    pub version: String,
    /// The plugin-api version the plugin was built with.
    pub plugin_api: String,
    /// Must equal the manifest's `formats` (order does not matter).
    pub formats: Vec<String>,
    /// Must equal the manifest's `aliases`.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Must equal the manifest's capability ids (the requirements are the
    /// manifest's business).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// How many `generate` calls an in-process engine serves at once (it
    /// batches them); the host passes up to this many through concurrently
    /// and queues the rest. Absent (plugins built before this field, and
    /// engines that run one request at a time): 1. Added in 1.x with a
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_generates: Option<u32>,
}

/// What the host learnt by running the manifest's probe program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeInput {
    /// The plugin's settings from the operator's config (`[plugins.ID]`).
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The outcome of the probe program, absent when the manifest names none.
    #[serde(default)]
    pub run: Option<ProbeRun>,
    /// The run that printed the engine's command-line surface: the first of
    /// the manifest's `[flag_surface] args` that exited 0, else the last
    /// one tried; absent when the manifest asks for none or the program did
    /// not run. Its output is kept up to 1 MiB. Added in 1.3 with a default.
    #[serde(default)]
    pub surface: Option<ProbeRun>,
}

/// The outcome of running a probe program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProbeRun {
    /// The program ran to completion.
    #[non_exhaustive]
    Exited {
        /// The resolved path of the program.
        program: String,
        /// Exit code (`None` when killed by a signal).
        code: Option<i32>,
        /// Standard output, lossily decoded, at most 64 KiB (1 MiB for a surface run).
        stdout: String,
        /// Standard error, lossily decoded, at most 64 KiB (1 MiB for a surface run).
        stderr: String,
    },
    /// The program was not found in the configured path, `PATH` or the
    /// manifest's search paths.
    #[non_exhaustive]
    NotFound {
        /// Every place that was looked at.
        searched: Vec<String>,
    },
    /// The program could not be started.
    #[non_exhaustive]
    FailedToStart {
        /// The resolved path of the program.
        program: String,
        /// The operating system's error.
        error: String,
    },
    /// The program outlived the probe timeout and was killed.
    #[non_exhaustive]
    TimedOut {
        /// The resolved path of the program.
        program: String,
        /// The limit, in milliseconds.
        after_ms: u64,
    },
}

/// The plugin's reading of its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeReport {
    /// Whether the engine can serve at all. A plugin whose engine is missing
    /// is skipped by resolution with `detail` as the reason.
    pub available: bool,
    /// The engine version, when it could be read unambiguously. `None`
    /// keeps the engine usable with every version-gated capability off.
    #[serde(default)]
    pub version: Option<String>,
    /// The program that will serve, when there is one.
    #[serde(default)]
    pub program: Option<String>,
    /// The device the engine will use, when the plugin knows (`cpu`, `gpu`).
    #[serde(default)]
    pub device: Option<String>,
    /// Why the engine is unavailable or its version unknown; free text.
    #[serde(default)]
    pub detail: Option<String>,
    /// The command-line options the engine accepts (`--ctx-size`, `-c`),
    /// when the plugin read them from `ProbeInput::surface`; `None` when it
    /// did not. The host gates the manifest's `[flag_surface.capabilities]`
    /// on them, and the plugin's `plan_launch` sees them in
    /// `LoadRequest::engine`. Added in 1.3 with a default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
}

/// The host asks a plugin how to serve one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoadRequest {
    /// The model's id in the API (`tiny-llama`, `org/name`).
    pub model_id: String,
    /// The model folder or file.
    pub model_path: String,
    /// The model's files: the names in `model_path` when it is a folder (a
    /// `.gguf` model's shards, a safetensors model's `config.json` …), or
    /// the file's own name. A WebAssembly plugin cannot look at the disk, so
    /// the host tells it. Added in 1.0 with a default, like every field a
    /// minor release adds.
    #[serde(default)]
    pub model_files: Vec<String>,
    /// The canonical format.
    pub format: String,
    /// The accelerator resolution picked for this machine.
    pub accelerator: String,
    /// The probe's report for the engine that will serve.
    pub engine: ProbeReport,
    /// Capability ids that are on for this engine version.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Resolved settings for this model (layers already merged by the
    /// host), by setting name. See [`settings`] for the names Hangar knows.
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The plugin's own settings from the operator's config.
    #[serde(default)]
    pub plugin_settings: BTreeMap<String, serde_json::Value>,
    /// Loopback address the engine must listen on.
    pub host: String,
    /// Port the engine must listen on; the host picked a free one.
    pub port: u16,
    /// A writable folder for this session (config files, caches).
    pub work_dir: String,
    /// The machines to spread the model over, when the model's settings
    /// ask for the engine's distributed mode (`distributed` and `cluster`)
    /// and the plugin has the capability; `None` serves on this machine
    /// alone. Added in 1.x: plugins built before it never see a cluster.
    #[serde(default)]
    pub cluster: Option<Cluster>,
    /// A writable folder for this plugin's caches that outlives sessions
    /// and host restarts (`<state dir>/cache/<plugin id>`; a prefix cache
    /// on disk, say). Added in 1.1: `None` from older hosts.
    #[serde(default)]
    pub cache_dir: Option<String>,
    /// What the model does, as the host's catalog reads its files: `chat`,
    /// `embedding` (an engine process serves `/v1/embeddings` for it) or
    /// `rerank` (`/v1/rerank`). Added in 1.4: `None` from older hosts,
    /// which load chat models only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_kind: Option<String>,
}

/// One model spread over several machines by the engine's own distributed
/// runtime: the peers of a `[clusters.NAME]` table of the operator's
/// `config.toml`, and the mode the model's settings chose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Cluster {
    /// The cluster's name in `config.toml`.
    pub name: String,
    /// How the model is split.
    pub mode: DistributedMode,
    /// The machines, in rank order: peer `i` runs rank `i`. The first is
    /// this machine, where rank 0 serves HTTP on loopback.
    pub peers: Vec<Peer>,
    /// The first TCP port the ranks talk to each other on; rank `i` of an
    /// engine that needs one port per rank listens on `port + i`.
    pub port: u16,
}

/// How a model is split across a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DistributedMode {
    /// Every rank holds a slice of every layer
    /// ([`crate::capability::DISTRIBUTED_TENSOR`]).
    Tensor,
    /// Every rank holds a run of whole layers
    /// ([`crate::capability::DISTRIBUTED_PIPELINE`]).
    Pipeline,
}

impl DistributedMode {
    /// The setting's value (`tensor`, `pipeline`).
    pub fn as_str(self) -> &'static str {
        match self {
            DistributedMode::Tensor => "tensor",
            DistributedMode::Pipeline => "pipeline",
        }
    }

    /// The capability an engine needs for this mode.
    pub fn capability(self) -> &'static str {
        match self {
            DistributedMode::Tensor => crate::capability::DISTRIBUTED_TENSOR,
            DistributedMode::Pipeline => crate::capability::DISTRIBUTED_PIPELINE,
        }
    }
}

/// One machine of a cluster, and how it is reached. Hangar runs no agent
/// of its own on peers: an engine's launcher reaches them over `ssh`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Peer {
    /// The peer's name in the cluster (shown with its rank).
    pub name: String,
    /// Where `ssh` logs in (`user@host`, a `~/.ssh/config` alias);
    /// `127.0.0.1` is this machine, started without ssh.
    pub ssh: String,
    /// The IP address the ranks use to reach this peer.
    pub ip: String,
    /// Whether the peer is this machine (`ssh = "127.0.0.1"`): its rank is
    /// a process the host can see and supervise directly.
    pub local: bool,
}

/// Setting names the host understands, shared by every plugin.
pub mod settings {
    /// Context length in tokens (integer).
    pub const CONTEXT_LENGTH: &str = "context_length";
    /// Default maximum tokens generated per request (integer).
    pub const MAX_TOKENS: &str = "max_tokens";
    /// Default sampling temperature (number).
    pub const TEMPERATURE: &str = "temperature";
    /// Default nucleus sampling mass (number).
    pub const TOP_P: &str = "top_p";
    /// Default top-k (integer).
    pub const TOP_K: &str = "top_k";
    /// Default min-p (number).
    pub const MIN_P: &str = "min_p";
    /// Default reasoning effort (`low`, `medium`, `high`): added in 1.x; an
    /// app default the host puts into chat requests that carry none, for
    /// engines with the `reasoning_effort` capability.
    pub const REASONING_EFFORT: &str = "reasoning_effort";
    /// Draft model folder for speculative decoding (string path).
    pub const DRAFT_MODEL: &str = "draft_model";
    /// Tokens drafted per step (integer).
    pub const DRAFT_TOKENS: &str = "draft_tokens";
    /// Prompt cache size in entries (integer).
    pub const PROMPT_CACHE_SIZE: &str = "prompt_cache_size";
    /// KV cache quantization bits (integer: 4 or 8).
    pub const KV_BITS: &str = "kv_bits";
    /// Extra keyword arguments for the chat template (object).
    pub const CHAT_TEMPLATE_ARGS: &str = "chat_template_args";
    /// How to split the model across machines: `tensor` or `pipeline`
    /// (enum; each value gated on its capability).
    pub const DISTRIBUTED: &str = "distributed";
    /// Which `[clusters.NAME]` of `config.toml` serves the model (string).
    pub const CLUSTER: &str = "cluster";
}

/// How the host starts and checks an engine process. The plugin only
/// plans; the host spawns, and only programs the manifest declares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LaunchPlan {
    /// The program: one of the manifest's `programs` or its probe program,
    /// by name or by the path the probe resolved.
    pub program: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the session's work dir).
    #[serde(default)]
    pub cwd: Option<String>,
    /// What "ready" looks like.
    pub readiness: Readiness,
    /// How long the engine may take to become ready, in milliseconds.
    pub start_timeout_ms: u64,
    /// The protocol the engine speaks.
    #[serde(default)]
    pub protocol: Protocol,
    /// The value to put in requests' `model` field; `None` removes the
    /// field (some engines treat any other value as a model to fetch).
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Notes the host shows with the session (settings the engine version
    /// ignored, fallbacks taken).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Files the host writes into the session's work dir before starting
    /// the engine (relative path → contents), such as a distributed
    /// config. Plugins never write files themselves.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The ranks of a distributed launch (empty: one process). The program
    /// is then the engine's launcher, which starts every rank; the host
    /// finds the local ranks among the launcher's processes, waits for all
    /// of them, and ends the whole session when any of them dies. Added
    /// in 1.x.
    #[serde(default)]
    pub ranks: Vec<Rank>,
    /// Prefixes of environment variables the engine must not inherit from
    /// the host (`LLAMA_` for an engine that reads `LLAMA_ARG_*` and
    /// `LLAMA_API_KEY`): variables of the host's environment with one of
    /// these prefixes are removed before the engine starts, except those
    /// the plan's `env` sets. So an operator's shell cannot change an
    /// engine's flags or add API keys behind Hangar's back. Added in 1.2.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_remove_prefixes: Vec<String>,
}

/// One rank of a distributed launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rank {
    /// The rank (0 serves HTTP).
    pub rank: u32,
    /// The peer it runs on ([`Peer::name`]).
    pub peer: String,
    /// Whether it runs on this machine.
    pub local: bool,
    /// An environment entry (`MLX_RANK=1`) that marks this rank's process
    /// among the launcher's, so that the host can watch a local rank.
    #[serde(default)]
    pub env_marker: Option<String>,
}

/// The protocol an engine process speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Protocol {
    /// OpenAI-compatible HTTP: `/v1/chat/completions`, `/v1/completions`.
    #[default]
    OpenaiHttp,
}

/// Readiness: poll `health_path` until it answers `ready_status`; then, if
/// given, send one `warmup` request, which must succeed. A status in
/// `failed_statuses` means the engine failed to load: the host stops it at
/// once instead of waiting out the start timeout.
///
/// While a session lives the host keeps polling the route. A status in
/// `busy_statuses` is the engine saying it is full, never failed; a status
/// in `failed_statuses` fails the session, unless the engine is still
/// streaming tokens to a client: an engine that streams is busy whatever
/// its readiness route says, and is judged again once its streams end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Readiness {
    /// The health route (`/health`).
    pub health_path: String,
    /// The status that means ready (200).
    #[serde(default = "default_ready_status")]
    pub ready_status: u16,
    /// A request that proves the model is loaded, sent once health is ok.
    #[serde(default)]
    pub warmup: Option<WarmupRequest>,
    /// Health statuses that mean the load failed for good (mlx_lm.server
    /// answers 503 after its loading thread died). Leave empty for engines
    /// that use such a status while loading.
    #[serde(default)]
    pub failed_statuses: Vec<u16>,
    /// Health statuses the engine answers while it serves at capacity
    /// (older mlxcel builds, and llama-server builds from llama.cpp #5548
    /// on, answer 503 `{"status":"no slot available"}` when every slot is
    /// taken). While the session lives they mean busy, never failed; at
    /// start they mean not ready yet. A status may be in both lists (a
    /// 503 that means "the load failed" at start can mean "full" later):
    /// at start it is failed, while serving busy. Added in
    /// 1.2: empty from older plugins, whose busy engines are still told
    /// from failed ones by their streams.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy_statuses: Vec<u16>,
}

fn default_ready_status() -> u16 {
    200
}

/// One request sent to prove readiness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WarmupRequest {
    /// The route (`/v1/completions`).
    pub path: String,
    /// The JSON body.
    pub body: serde_json::Value,
}

/// One generation request for an in-process engine: the OpenAI request,
/// reduced to what an engine needs. The host has already applied the
/// model's settings as defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GenerateRequest {
    /// Chat messages (OpenAI shape) or a plain prompt.
    pub input: GenerateInput,
    /// Most tokens to generate.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Sampling temperature (0: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k (0: off).
    #[serde(default)]
    pub top_k: Option<u32>,
    /// Min-p.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Strings that end generation (not included in the output).
    #[serde(default)]
    pub stop: Vec<String>,
    /// The request's tools (OpenAI's `tools` list), for the chat template
    /// to render; the host parses the calls in the answer. Added in 1.x
    /// with a default: an engine built before it never sees tools, and the
    /// host refuses tools for engines without the `tool_calls` capability.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// What the answer must be, as a grammar in llguidance's Lark syntax
    /// (JSON schemas inside as `%json { … }`): the host writes it from
    /// `response_format` or a forced tool choice, in the model's tool-call
    /// markup. An engine with the `structured_output` capability draws
    /// every token from those the grammar allows next and ends the answer
    /// where the grammar is complete. Added in 1.x with a default: the host
    /// sends none to an engine without the capability (it refuses such a
    /// request instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Text the answer is expected to resemble (OpenAI's Predicted
    /// Outputs, `prediction.content`): an engine that speculates may verify
    /// its tokens in one pass instead of generating them one by one; the
    /// answer is the same. Added in 1.5 with a default: an engine that does
    /// not read it generates as usual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<String>,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GenerateInput {
    /// OpenAI chat messages; the engine applies the model's chat template.
    #[non_exhaustive]
    Chat {
        /// The messages.
        messages: Vec<serde_json::Value>,
    },
    /// A raw prompt.
    #[non_exhaustive]
    Completion {
        /// The prompt text.
        prompt: String,
    },
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GenerateOutcome {
    /// `stop` (EOS or a stop string), `length` (max tokens) or `cancelled`
    /// (the sink said stop).
    pub finish_reason: String,
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Prompt tokens served from a cache (prefix reuse).
    #[serde(default)]
    pub cached_tokens: u32,
    /// What speculative decoding did for this answer, where the engine
    /// speculated. Added in 1.5 with a default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationUsage>,
}

/// What speculative decoding did for one answer: tokens proposed (by a
/// draft model, prompt lookup or the request's prediction), how many of
/// them the model kept, and in how many verifying passes. Added in 1.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SpeculationUsage {
    /// Verifying passes (each one weight read for several tokens).
    #[serde(default)]
    pub verifications: u32,
    /// Tokens proposed in all.
    #[serde(default)]
    pub proposed_tokens: u32,
    /// Of those, the ones the model kept.
    #[serde(default)]
    pub accepted_tokens: u32,
    /// Tokens of the request's prediction that the answer kept (OpenAI's
    /// `accepted_prediction_tokens`).
    #[serde(default)]
    pub accepted_prediction_tokens: u32,
    /// Tokens of the request's prediction proposed and not kept (OpenAI's
    /// `rejected_prediction_tokens`).
    #[serde(default)]
    pub rejected_prediction_tokens: u32,
    /// The engine's estimate of the time speculation saved this answer, in
    /// milliseconds: its tokens at the time a plain step takes, less the
    /// time its speculative steps took (negative where it cost time);
    /// `None` where the engine has no estimate. Added in 1.7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_saved_ms: Option<i64>,
}

impl SpeculationUsage {
    /// `verifications` passes proposed `proposed_tokens` and kept
    /// `accepted_tokens`; the prediction's share is added with
    /// [`SpeculationUsage::with_prediction`].
    pub fn new(verifications: u32, proposed_tokens: u32, accepted_tokens: u32) -> Self {
        SpeculationUsage {
            verifications,
            proposed_tokens,
            accepted_tokens,
            ..SpeculationUsage::default()
        }
    }

    /// With the prediction's tokens kept and rejected.
    pub fn with_prediction(mut self, accepted: u32, rejected: u32) -> Self {
        self.accepted_prediction_tokens = accepted;
        self.rejected_prediction_tokens = rejected;
        self
    }

    /// With the engine's estimate of the time saved, in milliseconds
    /// (negative where speculation cost time).
    pub fn with_time_saved(mut self, ms: i64) -> Self {
        self.time_saved_ms = Some(ms);
        self
    }
}

/// One embeddings request for an in-process engine (added in 1.4): the
/// inputs of OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and the like,
/// in order. The host sends it only to an engine whose description has the
/// `embeddings` capability and only for a model the catalog lists as an
/// embedding model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EmbedRequest {
    /// The inputs, each embedded on its own (batched as the engine likes).
    pub inputs: Vec<EmbedInput>,
}

/// One input to embed or to score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EmbedInput {
    /// Text, tokenised by the engine with the model's tokenizer (special
    /// tokens added as the model's tokenizer adds them).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// What an engine answers to an [`EmbedRequest`]: one vector per input, in
/// order, pooled and normalised as the model's own configuration says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EmbedOutcome {
    /// The vectors, one per input.
    pub embeddings: Vec<Vec<f32>>,
    /// Tokens read, over every input.
    pub prompt_tokens: u32,
    /// The pooling the engine did: `cls`, `mean`, `last` (or another id).
    #[serde(default)]
    pub pooling: String,
    /// Whether the vectors are L2-normalised.
    #[serde(default)]
    pub normalized: bool,
    /// Set instead of the vectors when an input cannot be embedded as sent
    /// (longer than the model reads, empty): the client's mistake, which
    /// the host answers with a 400 naming the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<InputRefusal>,
}

/// An input the engine refuses, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InputRefusal {
    /// The input's index in the request (for a rerank, in `documents`).
    pub input: u32,
    /// What is wrong, for the client (`input 3 has 700 tokens; the model
    /// reads at most 512`).
    pub message: String,
}

/// One rerank request for an in-process engine (added in 1.4): score each
/// document against the query with a cross-encoder. The host sends it only
/// to an engine with the `rerank` capability, for a model the catalog
/// lists as a reranker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RerankRequest {
    /// The query.
    pub query: String,
    /// The documents, scored in this order.
    pub documents: Vec<String>,
}

/// What an engine answers to a [`RerankRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RerankOutcome {
    /// One relevance score per document, in the request's order (the
    /// model's raw score; the host sorts).
    pub scores: Vec<f32>,
    /// Tokens read, over every (query, document) pair.
    pub prompt_tokens: u32,
    /// Set instead of the scores when a document cannot be scored as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<InputRefusal>,
}

// Constructors and builders. Every message type is `#[non_exhaustive]`, so
// that a 1.x minor release can add a field (or a variant) without breaking
// a plugin's source: plugins build messages with these functions and match
// them with `..`, never with struct literals or exhaustive patterns.

impl Description {
    /// The description of plugin `id` at `version` (the manifest's), built
    /// against this plugin-api, serving `formats`.
    pub fn new<S: Into<String>>(
        id: impl Into<String>,
        version: impl Into<String>,
        formats: impl IntoIterator<Item = S>,
    ) -> Self {
        Description {
            id: id.into(),
            version: version.into(),
            plugin_api: crate::PLUGIN_API_VERSION.into(),
            formats: formats.into_iter().map(Into::into).collect(),
            aliases: BTreeMap::new(),
            capabilities: Vec::new(),
            concurrent_generates: None,
        }
    }

    /// With the manifest's aliases (alias → canonical format).
    pub fn with_aliases<A: Into<String>, B: Into<String>>(
        mut self,
        aliases: impl IntoIterator<Item = (A, B)>,
    ) -> Self {
        self.aliases = aliases
            .into_iter()
            .map(|(a, b)| (a.into(), b.into()))
            .collect();
        self
    }

    /// With the manifest's capability ids.
    pub fn with_capabilities<S: Into<String>>(
        mut self,
        capabilities: impl IntoIterator<Item = S>,
    ) -> Self {
        self.capabilities = capabilities.into_iter().map(Into::into).collect();
        self
    }

    /// Saying that an in-process engine serves `n` generate calls at once.
    pub fn with_concurrent_generates(mut self, n: u32) -> Self {
        self.concurrent_generates = Some(n);
        self
    }

    /// Claiming another plugin-api version than the one built with (tests
    /// of the host's compatibility rule).
    pub fn with_plugin_api(mut self, version: impl Into<String>) -> Self {
        self.plugin_api = version.into();
        self
    }
}

impl ProbeInput {
    /// What a probe program's `run` said (`None`: the manifest names none),
    /// with no plugin settings.
    pub fn new(run: Option<ProbeRun>) -> Self {
        ProbeInput {
            settings: BTreeMap::new(),
            run,
            surface: None,
        }
    }

    /// With the plugin's settings from the operator's config.
    pub fn with_settings(mut self, settings: BTreeMap<String, serde_json::Value>) -> Self {
        self.settings = settings;
        self
    }

    /// With the run that printed the engine's command-line surface.
    pub fn with_surface(mut self, surface: Option<ProbeRun>) -> Self {
        self.surface = surface;
        self
    }
}

impl ProbeRun {
    /// The program ran to completion.
    pub fn exited(
        program: impl Into<String>,
        code: Option<i32>,
        stdout: impl Into<String>,
        stderr: impl Into<String>,
    ) -> Self {
        ProbeRun::Exited {
            program: program.into(),
            code,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    /// The program was not found in any of the `searched` places.
    pub fn not_found<S: Into<String>>(searched: impl IntoIterator<Item = S>) -> Self {
        ProbeRun::NotFound {
            searched: searched.into_iter().map(Into::into).collect(),
        }
    }

    /// The program could not be started.
    pub fn failed_to_start(program: impl Into<String>, error: impl Into<String>) -> Self {
        ProbeRun::FailedToStart {
            program: program.into(),
            error: error.into(),
        }
    }

    /// The program outlived the probe timeout of `after_ms`.
    pub fn timed_out(program: impl Into<String>, after_ms: u64) -> Self {
        ProbeRun::TimedOut {
            program: program.into(),
            after_ms,
        }
    }
}

impl ProbeReport {
    /// An engine that can serve, at `version` when it was read.
    pub fn available(version: Option<String>) -> Self {
        ProbeReport {
            available: true,
            version,
            ..ProbeReport::default()
        }
    }

    /// An engine that cannot serve, and why (shown as the reason
    /// resolution passed it over).
    pub fn unavailable(detail: impl Into<String>) -> Self {
        ProbeReport {
            available: false,
            detail: Some(detail.into()),
            ..ProbeReport::default()
        }
    }

    /// With the engine version.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// With the program that will serve.
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// With the device the engine will use (`cpu`, `gpu`).
    pub fn with_device(mut self, device: impl Into<String>) -> Self {
        self.device = Some(device.into());
        self
    }

    /// With a note on the engine (why its version is unknown, say).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// With the command-line options the engine accepts.
    pub fn with_flags(mut self, flags: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut flags: Vec<String> = flags.into_iter().map(Into::into).collect();
        flags.sort();
        flags.dedup();
        self.flags = Some(flags);
        self
    }

    /// Whether the engine accepts `option`: `None` when its surface was not
    /// read.
    pub fn accepts(&self, option: &str) -> Option<bool> {
        self.flags
            .as_ref()
            .map(|flags| flags.binary_search_by(|f| f.as_str().cmp(option)).is_ok())
    }
}

impl LoadRequest {
    /// A request to serve the model `model_id` at `model_path` in the
    /// canonical `format`; the rest as an in-test default (accelerator
    /// `cpu`, an available engine of unknown version, loopback port 0, no
    /// settings) until set with the `with_*` functions. The host fills
    /// every field; plugins build requests only in their tests.
    pub fn new(
        model_id: impl Into<String>,
        model_path: impl Into<String>,
        format: impl Into<String>,
    ) -> Self {
        LoadRequest {
            model_id: model_id.into(),
            model_path: model_path.into(),
            model_files: Vec::new(),
            format: format.into(),
            accelerator: "cpu".into(),
            engine: ProbeReport::available(None),
            capabilities: Vec::new(),
            settings: BTreeMap::new(),
            plugin_settings: BTreeMap::new(),
            host: "127.0.0.1".into(),
            port: 0,
            work_dir: String::new(),
            cluster: None,
            cache_dir: None,
            model_kind: None,
        }
    }

    /// With the model's file names.
    pub fn with_model_files<S: Into<String>>(mut self, files: impl IntoIterator<Item = S>) -> Self {
        self.model_files = files.into_iter().map(Into::into).collect();
        self
    }

    /// With the accelerator resolution picked.
    pub fn with_accelerator(mut self, accelerator: impl Into<String>) -> Self {
        self.accelerator = accelerator.into();
        self
    }

    /// With the probe's report on the engine that will serve.
    pub fn with_engine(mut self, engine: ProbeReport) -> Self {
        self.engine = engine;
        self
    }

    /// With the capability ids that are on.
    pub fn with_capabilities<S: Into<String>>(
        mut self,
        capabilities: impl IntoIterator<Item = S>,
    ) -> Self {
        self.capabilities = capabilities.into_iter().map(Into::into).collect();
        self
    }

    /// With the model's resolved settings.
    pub fn with_settings(mut self, settings: BTreeMap<String, serde_json::Value>) -> Self {
        self.settings = settings;
        self
    }

    /// With one more resolved setting.
    pub fn with_setting(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.settings.insert(name.into(), value);
        self
    }

    /// With the plugin's own settings.
    pub fn with_plugin_settings(mut self, settings: BTreeMap<String, serde_json::Value>) -> Self {
        self.plugin_settings = settings;
        self
    }

    /// With the address the engine must listen on.
    pub fn with_endpoint(mut self, host: impl Into<String>, port: u16) -> Self {
        self.host = host.into();
        self.port = port;
        self
    }

    /// With the session's writable folder.
    pub fn with_work_dir(mut self, work_dir: impl Into<String>) -> Self {
        self.work_dir = work_dir.into();
        self
    }

    /// With the machines to spread the model over.
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// With the plugin's cache folder.
    pub fn with_cache_dir(mut self, cache_dir: impl Into<String>) -> Self {
        self.cache_dir = Some(cache_dir.into());
        self
    }

    /// With what the model does (`chat`, `embedding`, `rerank`).
    pub fn with_model_kind(mut self, kind: impl Into<String>) -> Self {
        self.model_kind = Some(kind.into());
        self
    }
}

impl Cluster {
    /// The cluster `name`, split by `mode` over `peers` (in rank order),
    /// its ranks talking from `port` on.
    pub fn new(
        name: impl Into<String>,
        mode: DistributedMode,
        peers: Vec<Peer>,
        port: u16,
    ) -> Self {
        Cluster {
            name: name.into(),
            mode,
            peers,
            port,
        }
    }
}

impl Peer {
    /// The peer `name`, reached over `ssh` and at `ip`; it is this machine
    /// when `ssh` is `127.0.0.1`.
    pub fn new(name: impl Into<String>, ssh: impl Into<String>, ip: impl Into<String>) -> Self {
        let ssh = ssh.into();
        Peer {
            name: name.into(),
            local: ssh == "127.0.0.1",
            ssh,
            ip: ip.into(),
        }
    }
}

impl LaunchPlan {
    /// A plan to run `program` with `args`; readiness is `GET /health`
    /// answering 200, within a start timeout of 60 s, speaking the default
    /// protocol, with no environment, notes, files or ranks until set with
    /// the `with_*` functions.
    pub fn new<S: Into<String>>(
        program: impl Into<String>,
        args: impl IntoIterator<Item = S>,
    ) -> Self {
        LaunchPlan {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
            readiness: Readiness::new("/health"),
            start_timeout_ms: 60_000,
            protocol: Protocol::default(),
            upstream_model: None,
            notes: Vec::new(),
            files: BTreeMap::new(),
            ranks: Vec::new(),
            env_remove_prefixes: Vec::new(),
        }
    }

    /// With the extra environment.
    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }

    /// With one more environment variable.
    pub fn with_env_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// With a working directory.
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// With what "ready" looks like.
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// With how long the engine may take to become ready.
    pub fn with_start_timeout_ms(mut self, ms: u64) -> Self {
        self.start_timeout_ms = ms;
        self
    }

    /// With the protocol the engine speaks.
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// With the value to put in requests' `model` field.
    pub fn with_upstream_model(mut self, model: impl Into<String>) -> Self {
        self.upstream_model = Some(model.into());
        self
    }

    /// With notes the host shows with the session.
    pub fn with_notes<S: Into<String>>(mut self, notes: impl IntoIterator<Item = S>) -> Self {
        self.notes = notes.into_iter().map(Into::into).collect();
        self
    }

    /// With files the host writes into the work dir (path → contents).
    pub fn with_files(mut self, files: BTreeMap<String, String>) -> Self {
        self.files = files;
        self
    }

    /// With the ranks of a distributed launch.
    pub fn with_ranks(mut self, ranks: Vec<Rank>) -> Self {
        self.ranks = ranks;
        self
    }

    /// Without the host's environment variables that start with any of
    /// `prefixes` (unless `env` sets them).
    pub fn with_env_remove_prefixes<S: Into<String>>(
        mut self,
        prefixes: impl IntoIterator<Item = S>,
    ) -> Self {
        self.env_remove_prefixes = prefixes.into_iter().map(Into::into).collect();
        self
    }
}

impl Rank {
    /// Rank `rank`, on the peer named `peer`, local or not.
    pub fn new(rank: u32, peer: impl Into<String>, local: bool) -> Self {
        Rank {
            rank,
            peer: peer.into(),
            local,
            env_marker: None,
        }
    }

    /// With the environment entry that marks this rank's process.
    pub fn with_env_marker(mut self, marker: impl Into<String>) -> Self {
        self.env_marker = Some(marker.into());
        self
    }
}

impl Readiness {
    /// Poll `health_path` until it answers 200; no warmup, no failed or
    /// busy statuses until set with the `with_*` functions.
    pub fn new(health_path: impl Into<String>) -> Self {
        Readiness {
            health_path: health_path.into(),
            ready_status: default_ready_status(),
            warmup: None,
            failed_statuses: Vec::new(),
            busy_statuses: Vec::new(),
        }
    }

    /// With the status that means ready.
    pub fn with_ready_status(mut self, status: u16) -> Self {
        self.ready_status = status;
        self
    }

    /// With a request that proves the model is loaded.
    pub fn with_warmup(mut self, warmup: WarmupRequest) -> Self {
        self.warmup = Some(warmup);
        self
    }

    /// With the statuses that mean the load failed for good.
    pub fn with_failed_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.failed_statuses = statuses.into_iter().collect();
        self
    }

    /// With the statuses the engine answers while it serves at capacity.
    pub fn with_busy_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.busy_statuses = statuses.into_iter().collect();
        self
    }
}

impl WarmupRequest {
    /// A `POST` of `body` to `path`.
    pub fn new(path: impl Into<String>, body: serde_json::Value) -> Self {
        WarmupRequest {
            path: path.into(),
            body,
        }
    }
}

impl GenerateRequest {
    /// Generate from `input` with the engine's defaults for everything
    /// else until set with the `with_*` functions.
    pub fn new(input: GenerateInput) -> Self {
        GenerateRequest {
            input,
            max_tokens: None,
            temperature: None,
            top_p: None,
            top_k: None,
            min_p: None,
            seed: None,
            stop: Vec::new(),
            tools: Vec::new(),
            grammar: None,
            prediction: None,
        }
    }

    /// With the text the answer is expected to resemble (a predicted
    /// output).
    pub fn with_prediction(mut self, text: impl Into<String>) -> Self {
        self.prediction = Some(text.into());
        self
    }

    /// With a grammar the answer must follow (llguidance's Lark syntax).
    pub fn with_grammar(mut self, lark: impl Into<String>) -> Self {
        self.grammar = Some(lark.into());
        self
    }

    /// With the request's tools (OpenAI's `tools` list).
    pub fn with_tools(mut self, tools: Vec<serde_json::Value>) -> Self {
        self.tools = tools;
        self
    }

    /// With the most tokens to generate.
    pub fn with_max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// With the sampling temperature.
    pub fn with_temperature(mut self, t: f32) -> Self {
        self.temperature = Some(t);
        self
    }

    /// With the nucleus sampling mass.
    pub fn with_top_p(mut self, p: f32) -> Self {
        self.top_p = Some(p);
        self
    }

    /// With top-k.
    pub fn with_top_k(mut self, k: u32) -> Self {
        self.top_k = Some(k);
        self
    }

    /// With min-p.
    pub fn with_min_p(mut self, p: f32) -> Self {
        self.min_p = Some(p);
        self
    }

    /// With a sampling seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// With strings that end generation.
    pub fn with_stop<S: Into<String>>(mut self, stop: impl IntoIterator<Item = S>) -> Self {
        self.stop = stop.into_iter().map(Into::into).collect();
        self
    }
}

impl GenerateInput {
    /// OpenAI chat messages.
    pub fn chat(messages: Vec<serde_json::Value>) -> Self {
        GenerateInput::Chat { messages }
    }

    /// A raw prompt.
    pub fn completion(prompt: impl Into<String>) -> Self {
        GenerateInput::Completion {
            prompt: prompt.into(),
        }
    }
}

impl GenerateOutcome {
    /// A generation that ended for `finish_reason` after `prompt_tokens`
    /// in and `completion_tokens` out, none from a cache.
    pub fn new(
        finish_reason: impl Into<String>,
        prompt_tokens: u32,
        completion_tokens: u32,
    ) -> Self {
        GenerateOutcome {
            finish_reason: finish_reason.into(),
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            speculation: None,
        }
    }

    /// With the prompt tokens served from a cache.
    pub fn with_cached_tokens(mut self, n: u32) -> Self {
        self.cached_tokens = n;
        self
    }

    /// With what speculative decoding did.
    pub fn with_speculation(mut self, usage: SpeculationUsage) -> Self {
        self.speculation = Some(usage);
        self
    }
}

impl EmbedRequest {
    /// Embed `inputs`.
    // Written out, so that a field a 1.x release adds is added here too
    // (tests/plugin-source-compat/add_dummy_fields.py edits literals that
    // span lines).
    #[rustfmt::skip]
    pub fn new(inputs: Vec<EmbedInput>) -> Self {
        EmbedRequest {
            inputs,
        }
    }
}

impl EmbedInput {
    /// Text to tokenise.
    pub fn text(text: impl Into<String>) -> Self {
        EmbedInput::Text(text.into())
    }

    /// Token ids.
    pub fn tokens(tokens: Vec<u32>) -> Self {
        EmbedInput::Tokens(tokens)
    }
}

impl EmbedOutcome {
    /// `embeddings` (one per input) after reading `prompt_tokens`, pooled
    /// by `pooling`, `normalized` or not.
    pub fn new(
        embeddings: Vec<Vec<f32>>,
        prompt_tokens: u32,
        pooling: impl Into<String>,
        normalized: bool,
    ) -> Self {
        EmbedOutcome {
            embeddings,
            prompt_tokens,
            pooling: pooling.into(),
            normalized,
            refused: None,
        }
    }

    /// The answer for a request whose input `input` cannot be embedded.
    pub fn refused(input: u32, message: impl Into<String>) -> Self {
        EmbedOutcome {
            embeddings: Vec::new(),
            prompt_tokens: 0,
            pooling: String::new(),
            normalized: false,
            refused: Some(InputRefusal::new(input, message)),
        }
    }
}

impl InputRefusal {
    /// Input `input` is refused because of `message`.
    pub fn new(input: u32, message: impl Into<String>) -> Self {
        InputRefusal {
            input,
            message: message.into(),
        }
    }
}

impl RerankRequest {
    /// Score `documents` against `query`.
    pub fn new<S: Into<String>>(
        query: impl Into<String>,
        documents: impl IntoIterator<Item = S>,
    ) -> Self {
        RerankRequest {
            query: query.into(),
            documents: documents.into_iter().map(Into::into).collect(),
        }
    }
}

impl RerankOutcome {
    /// One score per document, after reading `prompt_tokens`.
    pub fn new(scores: Vec<f32>, prompt_tokens: u32) -> Self {
        RerankOutcome {
            scores,
            prompt_tokens,
            refused: None,
        }
    }

    /// The answer for a request whose document `document` cannot be scored.
    pub fn refused(document: u32, message: impl Into<String>) -> Self {
        RerankOutcome {
            scores: Vec::new(),
            prompt_tokens: 0,
            refused: Some(InputRefusal::new(document, message)),
        }
    }
}
