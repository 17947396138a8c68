//! Hangar's integration tests: one binary, one module per area.

mod fixtures;
mod inprocess;
mod registry;
mod serve;
