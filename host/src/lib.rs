//! Hangar: a small, fast host for local LLM inference engines.
//!
//! Engines arrive as plugins dropped into a folder. The [`registry`] reads
//! every plugin's manifest without running its code, loads plugins on
//! demand through the [`loader`]s, probes their engines, and resolves a
//! model's format to the highest-priority engine that can serve it on this
//! [`platform`]. The `hangar` binary ([`cli`]) shows all of it.
//!
//! For plugin authors, `hangar plugin` writes a plugin crate from the SDK's
//! [`template`], runs the [`conformance`] suite on a [`plugin_folder`], and
//! [`package`]s it into one file that installs into a plugins dir. The
//! test kit (`hangar-sdk-testkit`) re-exports the suite for a plugin's own
//! `cargo test`.

pub mod api;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod loader;
pub mod models;
pub mod package;
pub mod platform;
pub mod plugin_cmd;
pub mod plugin_folder;
pub mod registry;
pub mod serve;
pub mod sessions;
pub mod settings;
pub mod supervisor;
pub mod template;
pub mod worker;
