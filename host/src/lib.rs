//! Hangar: a small, fast host for local LLM inference engines.
//!
//! Engines arrive as plugins dropped into a folder. The [`registry`] reads
//! every plugin's manifest without running its code, loads plugins on
//! demand through the [`loader`]s, probes their engines, and resolves a
//! model's format to the highest-priority engine that can serve it on this
//! [`platform`]. The `hangar` binary ([`cli`]) shows all of it.

pub mod api;
pub mod cli;
pub mod config;
pub mod loader;
pub mod models;
pub mod platform;
pub mod registry;
pub mod serve;
pub mod sessions;
pub mod settings;
pub mod supervisor;
pub mod worker;
