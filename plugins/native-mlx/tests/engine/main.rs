//! Integration tests of the engine on random-weight models that the tests generate (one binary, shared fixtures).

mod batch;
mod fixtures;
mod greedy;
mod parity;
mod session;
