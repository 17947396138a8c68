//! The scheduler: which requests run, wait or are refused, which models
//! load, stay, drain and go, within the machine's memory.
//!
//! - [`machine`] decides, as a pure state machine over events (requests,
//!   loads, releases, time, memory readings) — no clock, no I/O;
//! - [`guard`] is the memory guard's arithmetic (levels, reserves, ceiling);
//! - [`estimate`] estimates what a model needs before it loads;
//! - [`readings`] reads what the machine has (Linux `/proc` and cgroups,
//!   macOS `sysctl`, `nvidia-smi`) and what each engine's process tree
//!   holds;
//! - `driver` is the only part with tokio in it: it feeds the machine from
//!   the API and the clock and carries its decisions out on the sessions.

pub(crate) mod driver;
pub mod estimate;
pub mod guard;
pub mod machine;
pub mod readings;
#[cfg(test)]
mod tests;
