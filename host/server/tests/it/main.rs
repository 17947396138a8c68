//! Hangar's integration tests: one binary, one module per area.

mod cluster;
mod conformance;
mod embeddings;
mod fallback;
mod fixtures;
mod hardening;
mod health;
mod inprocess;
mod live;
mod messages;
mod models;
mod names;
mod package;
mod plugin_cmd;
mod registry;
mod request_gates;
mod scheduler;
mod serve;
mod stalls;
mod tools;
mod wasm;
