//! Integration tests of the engine on random-weight models that the tests generate (one binary, shared fixtures), and on the real model of scripts/real-model.sh.

mod batch;
mod constrained;
mod embed;
mod fixtures;
mod greedy;
mod moe;
mod mtp;
mod parity;
mod qmv;
mod real;
mod session;
mod specprefill;
mod speculate;
mod vision;
mod vlm;
