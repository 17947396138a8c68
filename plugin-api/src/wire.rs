//! The messages that cross the plugin boundary.
//!
//! They are plain serde types; the native ABI carries them as JSON text
//! ([`crate::abi`]), so a 1.x minor release can add a field (always with
//! `#[serde(default)]`) without breaking plugins built against an older one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a plugin's code says about itself. The host compares it with the
/// manifest and refuses a plugin whose code and manifest disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct ProbeInput {
    /// The plugin's settings from the operator's config (`[plugins.ID]`).
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The outcome of the probe program, absent when the manifest names none.
    #[serde(default)]
    pub run: Option<ProbeRun>,
}

/// The outcome of running a probe program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProbeRun {
    /// The program ran to completion.
    Exited {
        /// The resolved path of the program.
        program: String,
        /// Exit code (`None` when killed by a signal).
        code: Option<i32>,
        /// Standard output, lossily decoded, at most 64 KiB.
        stdout: String,
        /// Standard error, lossily decoded, at most 64 KiB.
        stderr: String,
    },
    /// The program was not found in the configured path, `PATH` or the
    /// manifest's search paths.
    NotFound {
        /// Every place that was looked at.
        searched: Vec<String>,
    },
    /// The program could not be started.
    FailedToStart {
        /// The resolved path of the program.
        program: String,
        /// The operating system's error.
        error: String,
    },
    /// The program outlived the probe timeout and was killed.
    TimedOut {
        /// The resolved path of the program.
        program: String,
        /// The limit, in milliseconds.
        after_ms: u64,
    },
}

/// The plugin's reading of its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// The host asks a plugin how to serve one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// One model spread over several machines by the engine's own distributed
/// runtime: the peers of a `[clusters.NAME]` table of the operator's
/// `config.toml`, and the mode the model's settings chose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// One rank of a distributed launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub enum Protocol {
    /// OpenAI-compatible HTTP: `/v1/chat/completions`, `/v1/completions`.
    #[default]
    OpenaiHttp,
}

/// Readiness: poll `health_path` until it answers `ready_status`; then, if
/// given, send one `warmup` request, which must succeed. A status in
/// `failed_statuses` means the engine failed to load: the host stops it at
/// once instead of waiting out the start timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

fn default_ready_status() -> u16 {
    200
}

/// One request sent to prove readiness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GenerateInput {
    /// OpenAI chat messages; the engine applies the model's chat template.
    Chat {
        /// The messages.
        messages: Vec<serde_json::Value>,
    },
    /// A raw prompt.
    Completion {
        /// The prompt text.
        prompt: String,
    },
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}
