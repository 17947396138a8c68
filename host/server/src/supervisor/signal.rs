//! The signals that end the host or a worker: Ctrl-C and SIGTERM.

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("a TERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
