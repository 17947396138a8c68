//! Hangar's integration tests: one binary, one module per area.

mod conformance;
mod fixtures;
mod inprocess;
mod package;
mod plugin_cmd;
mod registry;
mod scheduler;
mod serve;
mod wasm;
