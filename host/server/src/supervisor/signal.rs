//! The signals that end the host or a worker: Ctrl-C and SIGTERM.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn wait_for_signal() {
    Signals::new().next().await;
}

/// Ctrl-C and SIGTERM, as a stream: the host stops gracefully on the first
/// and exits at once on the second. Registered once, so that a signal sent
/// between the two waits is not lost.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Starts listening.
    pub(crate) fn new() -> Signals {
        Signals {
            interrupt: signal(SignalKind::interrupt()).expect("an INT handler"),
            terminate: signal(SignalKind::terminate()).expect("a TERM handler"),
        }
    }

    /// Resolves on the next Ctrl-C or SIGTERM.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
