//! Hangar's engine library: everything about plugins that needs no server.
//!
//! The [`registry`] reads every plugin's manifest in the configured plugin
//! folders without running its code ([`config`] says where), validates it,
//! loads plugins on demand through the [`loader`]s (native libraries through
//! `abi_stable`; WebAssembly components in a wasmtime sandbox, behind the
//! `wasm` feature), probes their engines, and resolves a model's format to
//! the highest-priority engine that can serve it on this [`platform`].
//! [`registry::programs`] is the one rule for what a plugin may have the
//! host run (declared programs; shells and interpreters only where the
//! operator allows them). [`models`] recognises model folders and files on
//! disk by the recognition rules the registry merges (the built-in `mlx`
//! and `gguf` rules and plugins' `[[recognize]]`).
//!
//! For plugin authors, the [`conformance`] suite runs a built
//! [`plugin_folder`] through the host's own loading code; `hangar plugin
//! check` and the SDK's test kit (`hangar-sdk-testkit`) both use it, and the
//! test kit depends on this crate alone, so a plugin's tests never compile
//! the HTTP server.
//!
//! Imports run one way: the server (`hangar`) builds on this crate, and this
//! crate knows nothing of it.

pub mod config;
pub mod conformance;
pub mod loader;
pub mod models;
pub mod platform;
pub mod plugin_folder;
pub mod registry;
pub mod text;
