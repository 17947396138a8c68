//! The HTTP listener under the router: accepts connections, serves them
//! with hyper, and stops within a deadline.
//!
//! `axum::serve` sets no header-read timeout, and its graceful shutdown
//! waits for every connection however long it takes: a client half-way
//! through its headers would hold a SIGTERM'd host forever. Here a
//! connection gets [`HEADER_READ_TIMEOUT`] to send its headers, and
//! shutdown gives open connections at most a drain period before the host
//! exits anyway. Each connection's writes also carry the client stall
//! deadline (see [`super::stall`]), and its requests the [`ClientWatch`]
//! that says whether it passed.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::stall::{ClientWatch, StallDeadline};
use crate::settings::SettingsStore;

/// The send buffer of a client's connection, in bytes (Linux doubles it
/// for its bookkeeping): plenty for answers, which are small or streamed.
pub(crate) const SEND_BUFFER: usize = 256 * 1024;

/// How long a client may take to send a request's headers.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop` is cancelled; then stops
/// accepting, asks open connections to finish, and returns once they have
/// or `drain` has passed. Each connection gets the client stall deadline
/// `settings` hold when it is accepted.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    drain: Duration,
    settings: Arc<SettingsStore>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // A streamed answer is many small writes; with Nagle on,
                    // the first event after the headers waits for the
                    // client's delayed ACK (about 40 ms on Linux).
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!("cannot turn Nagle's algorithm off on a connection: {e}");
                    }
                    // What a client that stops reading can hold in the kernel,
                    // and how soon its stall shows: autotuned, a send buffer
                    // grows to megabytes, tens of seconds of tokens.
                    if let Err(e) = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER) {
                        tracing::debug!("cannot cap a connection's send buffer: {e}");
                    }
                    stream
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let watch = ClientWatch::new(settings.get().serving.client_stall());
        let stream = StallDeadline::new(stream, watch.clone());
        let service = router.clone().map_request(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(watch.clone());
                request
            },
        );
        let service = TowerToHyperService::new(service);
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(drain) => {
            tracing::warn!("connections still open after {drain:?}; exiting anyway");
        }
    }
}
