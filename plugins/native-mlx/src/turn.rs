//! This process's MLX work, one thread at a time.
//!
//! MLX 0.32's CUDA backend races when two threads first run the same kernel
//! at once: `JitModule::get_kernel_and_dims` marks a kernel configured
//! before it stores its block size, so the second thread may launch it with
//! a block size of 0 (mlxcel hit this as SIGFPE, lablup/mlxcel#1655). This
//! engine's GPU tests died of a segfault with 16 threads and pass one at a
//! time. So the engine takes a process-wide turn around each piece of its
//! MLX work: a model's load, a batch step, a session's prefill and each of
//! its decoding steps, a scoring call. A turn ends before the engine waits
//! for requests or calls back with a token.
//!
//! One model per process (a `hangar worker`, the default) never waits for
//! it. Models that share a process (`isolation = "none"`) take turns a step
//! at a time, and a model that loads holds the others back for its load.
//! The CPU takes turns too: one rule on every device, and the CPU tests,
//! which run many sessions at once, exercise it.

use std::sync::{Mutex, MutexGuard, PoisonError};

static TURN: Mutex<()> = Mutex::new(());

/// Waits for this process's MLX turn, held until the guard drops.
///
/// Hold it around MLX work of your own (arrays you evaluate through mlx-rs)
/// in a process where sessions or batchers run on other threads. It is not
/// reentrant: while holding it, do not call a [`Session`](crate::Session)'s
/// methods on the same thread.
pub fn mlx_turn() -> MutexGuard<'static, ()> {
    // A panic under the turn leaves no state behind it to distrust: the
    // guarded value is `()`.
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}
