//! Clients that stop taking part: one that accepts no bytes of its answer,
//! or sends none of a request body it started, for `[serving]
//! client_stall_timeout_ms` is cut off, so that a slow or hostile client
//! cannot hold a model's slot or engine for everyone else.
//!
//! The write deadline sits under hyper, on the connection itself
//! ([`StallDeadline`]): hyper stops polling a response body while the
//! client's socket is full, so nothing above it could notice. When the
//! deadline passes the connection fails, hyper drops the response body,
//! and with it everything the request holds: its scheduler slot
//! ([`crate::sessions::InFlight`]), its upstream request or its engine's
//! channel (so the engine stops generating). [`watch`] then records a
//! `client_stalled` event for the model the answer came from.
//!
//! While a client is merely slow, nothing grows without bound: a proxied
//! stream is read from the engine only as the client takes it (the engine
//! then waits on its own socket), and an in-process engine's sink blocks,
//! pausing generation, once [`STREAM_BUFFER`] tokens and as many events
//! wait for the client. Beyond that a stream holds hyper's write queue and
//! the connection's send buffer, capped at [`super::listen::SEND_BUFFER`]
//! (an autotuned one grows to megabytes, which would also delay noticing a
//! stall by tens of seconds of tokens).
//!
//! A request body gets the same deadline between two of its chunks
//! ([`StallingBody`]); bodies are read whole before admission, so a stalled
//! one is refused with a 408 before it takes a slot.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::{ApiError, App};
use crate::sessions::Sessions;

/// How many tokens, and how many events, an in-process engine's stream
/// holds on the host for a client that has not taken them yet; then the
/// engine's sink blocks and its generation pauses.
pub(crate) const STREAM_BUFFER: usize = 64;

/// One connection's client: its stall deadline, and whether it passed.
/// Every request of the connection carries it (as an extension).
#[derive(Debug, Clone)]
pub(crate) struct ClientWatch {
    stalled: CancellationToken,
    timeout: Duration,
}

impl ClientWatch {
    /// A watch with this deadline.
    pub(crate) fn new(timeout: Duration) -> ClientWatch {
        ClientWatch {
            stalled: CancellationToken::new(),
            timeout,
        }
    }
}

/// A connection whose writes fail once the client has accepted no bytes
/// for the watch's deadline (a socket that stays full), as `SO_SNDTIMEO`
/// would, but on the async runtime.
pub(crate) struct StallDeadline<T> {
    io: T,
    watch: ClientWatch,
    /// Running while a write waits on a full socket; gone once one
    /// succeeds.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<T> StallDeadline<T> {
    /// `io` under `watch`'s deadline.
    pub(crate) fn new(io: T, watch: ClientWatch) -> StallDeadline<T> {
        StallDeadline {
            io,
            watch,
            blocked: None,
        }
    }

    /// `poll` of a write (`wrote`: one that takes bytes) under the
    /// deadline: a write that went through stops the clock, one that waits
    /// starts it, and one still waiting when it runs out fails.
    fn deadline<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<R>>,
        wrote: bool,
    ) -> Poll<io::Result<R>> {
        if let Poll::Ready(result) = poll {
            if wrote {
                self.blocked = None;
            }
            return Poll::Ready(result);
        }
        let timeout = self.watch.timeout;
        let blocked = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        // Polled with the write's waker: the connection is woken when the
        // deadline passes even if the socket never drains.
        if blocked.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.watch.stalled.cancel();
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client accepted no bytes for {timeout:?} (client_stall_timeout_ms)"),
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.deadline(cx, poll, true)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.deadline(cx, poll, true)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.deadline(cx, poll, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The model an answer comes from, put on the response by the route that
/// served it, so that a stall while it is sent is recorded against it.
#[derive(Debug, Clone)]
pub(crate) struct AnswerOf(pub String);

/// Middleware: puts the connection's deadline on the request body, refuses
/// a body that stalled with a 408, and records `client_stalled` when an
/// answer's connection is cut for a stall.
pub(super) async fn watch(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(watch) = request.extensions().get::<ClientWatch>().cloned() else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_string();
    let body_stalled = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(StallingBody {
            body,
            timeout: watch.timeout,
            idle: Box::pin(tokio::time::sleep(watch.timeout)),
            stalled: body_stalled.clone(),
        })
    });
    let response = next.run(request).await;
    let ms = watch.timeout.as_millis();
    if body_stalled.load(Ordering::SeqCst) {
        let message = format!(
            "the request body to {path} stopped arriving for {ms} ms (client_stall_timeout_ms); it was refused before it took a slot"
        );
        app.sessions
            .record("client_stalled", "-", None, message.clone());
        return ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "client_stalled",
            ..ApiError::bad_request(
                format!("{message}; send the whole body without pausing"),
                None,
            )
        }
        .into_response();
    }
    let Some(AnswerOf(model)) = response.extensions().get::<AnswerOf>().cloned() else {
        return response;
    };
    let record = StallRecord {
        sessions: app.sessions.clone(),
        watch,
        model,
    };
    holding(response, record)
}

/// `response` with `guard` held until hyper is done with its body (sent
/// whole, or dropped with a failed connection).
pub(crate) fn holding(response: Response, guard: impl Send + Sync + 'static) -> Response {
    response.map(|body| {
        Body::new(Guarded {
            body,
            _guard: Box::new(guard),
        })
    })
}

/// Records `client_stalled` for its model if the connection was cut for
/// a stall by the time the answer's body goes.
struct StallRecord {
    sessions: Arc<Sessions>,
    watch: ClientWatch,
    model: String,
}

impl Drop for StallRecord {
    fn drop(&mut self) {
        if self.watch.stalled.is_cancelled() {
            self.sessions.record(
                "client_stalled",
                &self.model,
                None,
                format!(
                    "the client accepted no bytes of its answer for {} ms (client_stall_timeout_ms): its connection was cut, its request ended and its slot freed",
                    self.watch.timeout.as_millis()
                ),
            );
        }
    }
}

/// A body passed on as it is, holding a guard until it is dropped.
struct Guarded {
    body: Body,
    _guard: Box<dyn Send + Sync>,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails once no chunk has arrived for `timeout`.
struct StallingBody {
    body: Body,
    timeout: Duration,
    idle: Pin<Box<Sleep>>,
    stalled: Arc<AtomicBool>,
}

/// The error a stalled request body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body stopped arriving for {0:?}")]
struct BodyStalled(Duration);

impl HttpBody for StallingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            let next = Instant::now() + self.timeout;
            self.idle.as_mut().reset(next);
            return Poll::Ready(frame);
        }
        if self.idle.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.stalled.store(true, Ordering::SeqCst);
        let timeout = self.timeout;
        Poll::Ready(Some(Err(axum::Error::new(BodyStalled(timeout)))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
