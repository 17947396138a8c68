//! Hangar's integration tests: one binary, one module per area.

mod conformance;
mod fallback;
mod fixtures;
mod hardening;
mod health;
mod inprocess;
mod messages;
mod package;
mod plugin_cmd;
mod registry;
mod scheduler;
mod serve;
mod wasm;
