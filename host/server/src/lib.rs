//! Hangar's server: the `hangar` binary and what it is made of, on top of
//! the engine library ([`hangar_engine`]: manifests, registry, resolution,
//! loaders, model recognition, the conformance suite).
//!
//! One chat request, from the router to the engine and back:
//!
//! 1. [`api`] (axum) receives `POST /v1/chat/completions`, checks the API
//!    key, and finds the model in the [`catalog`] (the model dirs' models,
//!    held in memory and rescanned when the dirs change).
//! 2. The [`scheduler`] admits the request (or queues it behind the host's
//!    and the model's concurrency limits, or refuses it with 429 or 503),
//!    makes room for the model if it must load (evicting least recently
//!    used idle models within the memory guard), then [`sessions`] returns
//!    the model's running session, or loads it: the
//!    registry resolves the model's format to an engine, [`settings`] gives
//!    the model's effective settings (refusing a gated one with a 422), and
//!    the plugin either plans a launch, which the [`supervisor`] spawns
//!    under a keeper and waits on until ready, or loads an in-process
//!    engine (in a [`worker`] child by default). Concurrent requests for a
//!    loading model share the one load.
//! 3. The API forwards the request to the session: proxied to the engine's
//!    loopback endpoint (mapped through a WebAssembly plugin's
//!    `map-request` where it has one), or generated in process through a
//!    token sink.
//! 4. The answer streams back through the API with the client's model id;
//!    an engine that dies mid-request fails it with a clear error, and the
//!    session is cleaned up so that the next request starts it again. Where
//!    the request has tools or the model's template marks reasoning, the
//!    answer's text is split by [`toolcall`] into content, reasoning and
//!    tool calls, the same for every engine and both APIs.
//!
//! [`serve`] wires these together for `hangar serve`; [`cli`] is the thin
//! command line over everything, and nothing below it imports it. For plugin
//! authors, `hangar plugin new/check/pack/install` ([`plugin_cmd`]) writes a
//! crate from the SDK's [`template`], runs the conformance suite, and
//! [`package`]s a plugin into one file.

#![warn(unreachable_pub)]

pub(crate) mod api;
pub(crate) mod bench;
pub(crate) mod catalog;
pub mod cli;
pub(crate) mod metrics;
pub(crate) mod model_store;
pub(crate) mod models_cmd;
pub(crate) mod names;
pub(crate) mod output;
pub mod package;
pub(crate) mod plugin_cmd;
pub(crate) mod pull;
pub(crate) mod resolved;
pub mod scheduler;
pub(crate) mod serve;
pub(crate) mod sessions;
pub(crate) mod settings;
pub(crate) mod supervisor;
pub(crate) mod template;
pub(crate) mod toolcall;
pub(crate) mod worker;
