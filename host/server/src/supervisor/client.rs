//! The proxy's client for an engine's loopback endpoint: hyper's HTTP/1
//! connections, kept open between requests, each driven by the task that
//! reads its answer.
//!
//! A hyper connection is a future that does the socket's I/O and hands an
//! answer's body over one HTTP chunk at a time; an engine sends one
//! server-sent event per chunk. Spawned on a task of its own, as reqwest
//! does, it costs a task wake-up, a handover and (downstream) a client
//! write per token. Here nothing is spawned: whoever waits on a request or
//! reads a body polls its connection too, and [`Body::read`] takes every
//! chunk the engine has already sent, so the relay writes them all at
//! once. A read never waits for more than the first chunk, so a paced
//! stream's token leaves as soon as it comes.
//!
//! The socket is read only when the body's holder asks, so a client that
//! reads slowly leaves the engine waiting on its own socket; dropping a
//! [`Body`] before its end closes the connection, which is how an engine
//! learns that its client went away.

use std::error::Error as _;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::header::{ACCEPT, CONTENT_TYPE, HOST};
use axum::http::{HeaderValue, Request, Response};
use bytes::BytesMut;
use futures_util::FutureExt;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How many bytes of the body one [`Body::read`] takes at most (it stops
/// at the chunk that reaches this): about ten events of a chat stream.
/// More would save few writes, and let one stream with a backlog (an
/// unpaced engine, a host that fell behind) hold its worker thread longer
/// while other streams wait for their first token. In the proxy bench's 64
/// unpaced streams that split reasoning, the median added time to first
/// token was 41–57 ms with 16 KiB reads, and 8–14 ms with these and the
/// turn a relay with more waiting gives the others.
const READ_SIZE: usize = 4 * 1024;

/// How long an unused connection is kept (reqwest's default, which the
/// proxy used before): an engine that keeps connections open meanwhile
/// serves the next request without a new connection.
const IDLE_FOR: Duration = Duration::from_secs(90);

/// At most this many unused connections are kept per engine.
const MAX_IDLE: usize = 128;

/// One engine's endpoint, with its connections that wait for a request.
#[derive(Debug)]
pub(crate) struct Connections {
    addr: SocketAddr,
    /// `127.0.0.1:PORT`, for the `host` header.
    authority: HeaderValue,
    connect_timeout: Duration,
    /// Most recently used last: the one taken next is the least likely
    /// to have been closed by the engine's own idle timeout.
    idle: Mutex<Vec<(Connection, Instant)>>,
}

/// A connection: where its requests go in, and the future that does its
/// I/O.
struct Connection {
    send: http1::SendRequest<String>,
    io: http1::Connection<TokioIo<TcpStream>, String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// An answer's body, read from its connection as its holder asks.
#[derive(Debug)]
pub(crate) struct Body {
    incoming: Incoming,
    /// `None` once it has closed, or gone back to its pool at the body's
    /// end.
    connection: Option<Connection>,
    pool: Arc<Connections>,
    /// A fault found after bytes that were passed on first.
    broken: Option<io::Error>,
    /// Whether the last read stopped at [`READ_SIZE`].
    more: bool,
}

impl Connections {
    /// The engine at `base_url` (`http://127.0.0.1:PORT`, as the supervisor
    /// starts engines), reached within `connect_timeout`.
    pub(crate) fn new(base_url: &str, connect_timeout: Duration) -> io::Result<Arc<Connections>> {
        let authority = base_url.strip_prefix("http://").unwrap_or(base_url);
        let addr = authority.parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the engine's address {base_url} is not http://IP:PORT: {e}"),
            )
        })?;
        Ok(Arc::new(Connections {
            addr,
            authority: HeaderValue::from_str(authority).expect("an IP:PORT is a header value"),
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }))
    }

    /// Sends `POST path` with the JSON `body` and returns the answer once
    /// its head has arrived.
    pub(crate) async fn post(
        self: &Arc<Self>,
        path: &str,
        body: String,
    ) -> io::Result<Response<Body>> {
        if let Some(kept) = self.take_idle() {
            match self.exchange(kept, path, body.clone()).await {
                // The engine closed a kept connection as the request went
                // out; it answered nothing, so nothing was served twice.
                Err(e) if unanswered(&e) => {}
                answer => return answer.map_err(with_causes),
            }
        }
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "connecting to {} took over {:?}",
                        self.addr, self.connect_timeout
                    ),
                )
            })?
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot connect to {}: {e}", self.addr))
            })?;
        // A request is one write; without this, a small one could wait on
        // the engine's delayed ACK.
        stream.set_nodelay(true)?;
        let (send, io) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(with_causes)?;
        self.exchange(Connection { send, io }, path, body)
            .await
            .map_err(with_causes)
    }

    /// Sends the request on `connection`, polling it until the answer's
    /// head has arrived.
    async fn exchange(
        self: &Arc<Self>,
        mut connection: Connection,
        path: &str,
        body: String,
    ) -> hyper::Result<Response<Body>> {
        let request = Request::post(path)
            .header(HOST, &self.authority)
            .header(ACCEPT, "*/*")
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .expect("a path and these headers make a request");
        let mut answer = pin!(connection.send.send_request(request));
        let mut connection = Some(connection);
        let answer = poll_fn(|cx| {
            drive(&mut connection, cx);
            answer.as_mut().poll(cx)
        })
        .await?;
        Ok(answer.map(|incoming| Body {
            incoming,
            connection,
            pool: self.clone(),
            broken: None,
            more: false,
        }))
    }

    /// A kept connection the engine has not closed, if there is one.
    fn take_idle(&self) -> Option<Connection> {
        loop {
            let popped = self
                .idle
                .lock()
                .expect("the pool's lock is never poisoned")
                .pop();
            let (mut connection, since) = popped?;
            if since.elapsed() > IDLE_FOR {
                continue;
            }
            // Polled once: a connection the engine closed meanwhile ends,
            // a live one says it takes the next request.
            let ready = poll_fn(|cx| match Pin::new(&mut connection.io).poll(cx) {
                Poll::Ready(_) => Poll::Ready(false),
                Poll::Pending => connection.send.poll_ready(cx).map(|r| r.is_ok()),
            });
            if ready.now_or_never() == Some(true) {
                return Some(connection);
            }
        }
    }

    fn keep(&self, connection: Connection) {
        let mut idle = self.idle.lock().expect("the pool's lock is never poisoned");
        idle.retain(|(_, since)| since.elapsed() <= IDLE_FOR);
        if idle.len() < MAX_IDLE {
            idle.push((connection, Instant::now()));
        }
    }
}

/// Polls `connection`'s I/O; one that has closed is dropped. Its faults
/// are not looked at here: hyper gives them to the request or the body
/// that they cut short.
fn drive(connection: &mut Option<Connection>, cx: &mut Context<'_>) {
    if let Some(c) = connection {
        if Pin::new(&mut c.io).poll(cx).is_ready() {
            *connection = None;
        }
    }
}

impl Body {
    /// Appends the next bytes of the body to `out`: every chunk that has
    /// arrived, up to about [`READ_SIZE`] bytes, without their chunked
    /// framing. Returns `false`, adding nothing, once the body has ended.
    ///
    /// Cancel-safe: dropped while it waits, it has taken nothing that a
    /// later call would not find.
    pub(crate) async fn read(&mut self, out: &mut BytesMut) -> io::Result<bool> {
        poll_fn(|cx| self.poll_read(cx, out)).await
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, out: &mut BytesMut) -> Poll<io::Result<bool>> {
        if let Some(e) = self.broken.take() {
            return Poll::Ready(Err(e));
        }
        let before = out.len();
        self.more = false;
        loop {
            if out.len() - before >= READ_SIZE {
                self.more = true;
                break;
            }
            // The connection passes on one chunk of what its socket holds
            // per poll.
            drive(&mut self.connection, cx);
            match Pin::new(&mut self.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        out.extend_from_slice(data);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.connection = None;
                    let e = with_causes(e);
                    // What came before the fault goes first.
                    if out.len() > before {
                        self.broken = Some(e);
                        break;
                    }
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(None) if out.len() > before => break,
                Poll::Ready(None) => {
                    // The connection goes back to the pool; one the engine
                    // does not keep has closed by now.
                    if let Some(connection) = self.connection.take() {
                        self.pool.keep(connection);
                    }
                    return Poll::Ready(Ok(false));
                }
                Poll::Pending => break,
            }
        }
        match out.len() > before {
            true => Poll::Ready(Ok(true)),
            false => Poll::Pending,
        }
    }

    /// Whether the last read stopped before all that had arrived: more is
    /// likely waiting.
    pub(crate) fn more_waiting(&self) -> bool {
        self.more
    }

    /// The whole body.
    pub(crate) async fn bytes(mut self) -> io::Result<bytes::Bytes> {
        let mut out = BytesMut::new();
        while self.read(&mut out).await? {}
        Ok(out.freeze())
    }
}

/// Whether a request failed before any of an answer came: the connection
/// was closed or reset under it, or was not ready for it.
fn unanswered(e: &hyper::Error) -> bool {
    let reset = e
        .source()
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            )
        });
    e.is_canceled() || e.is_incomplete_message() || reset
}

/// `e` as an I/O error whose message names its causes too (hyper's own
/// names only the kind of fault: "error reading a body from connection").
fn with_causes(e: hyper::Error) -> io::Error {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(&format!(": {c}"));
        cause = c.source();
    }
    io::Error::other(message)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use expect_test::{expect, Expect};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An engine that answers each request on a connection with the next
    /// of `answers`, written piece by piece (pieces separated by `|`, a
    /// pause between them); an answer ending in `#close` closes the
    /// connection after it, and one that is only `#close` closes it
    /// without answering. Returns its connections and a count of the
    /// connections it accepted.
    async fn engine(answers: &[&str]) -> (Arc<Connections>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let answers: Vec<String> = answers.iter().map(|a| a.to_string()).collect();
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut answers = answers.into_iter();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut stream = tokio::io::BufReader::new(stream);
                loop {
                    // The request: its head, then its content-length of body.
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    if line.is_empty() {
                        break;
                    }
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).await.unwrap();
                    let Some(answer) = answers.next() else { return };
                    let (answer, close) = match answer.strip_suffix("#close") {
                        Some(a) => (a.to_string(), true),
                        None => (answer, false),
                    };
                    for piece in answer.split('|').filter(|p| !p.is_empty()) {
                        stream.get_mut().write_all(piece.as_bytes()).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    if close {
                        break;
                    }
                }
            }
        });
        let connections =
            Connections::new(&format!("http://{addr}"), Duration::from_secs(5)).unwrap();
        (connections, accepted)
    }

    /// Posts to an engine answering `answer` and renders what the client
    /// sees: the status and content type, each read's bytes, then how the
    /// body ended and whether the connection was kept.
    async fn check(answer: &str, expected: Expect) {
        let (connections, _) = engine(&[answer]).await;
        let mut out = String::new();
        match connections.post("/v1/chat/completions", "{}".into()).await {
            Err(e) => out.push_str(&format!("error: {e}\n")),
            Ok(answer) => {
                let kind = answer
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok());
                out.push_str(&format!(
                    "{} {}\n",
                    answer.status().as_u16(),
                    kind.unwrap_or("-")
                ));
                let mut body = answer.into_body();
                let mut read = BytesMut::new();
                loop {
                    match body.read(&mut read).await {
                        Ok(true) => {
                            let text = String::from_utf8_lossy(&read).replace('\n', "\\n");
                            out.push_str(&format!("read {text:?}\n"));
                            read.clear();
                        }
                        Ok(false) => {
                            out.push_str("end\n");
                            break;
                        }
                        Err(e) => {
                            out.push_str(&format!("error: {e}\n"));
                            break;
                        }
                    }
                }
            }
        }
        // A kept connection that the engine closes after all is not
        // taken again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let kept = connections.take_idle().is_some();
        out.push_str(&format!("kept {kept}\n"));
        expected.assert_eq(&out);
    }

    #[tokio::test]
    async fn chunks_split_anywhere_are_joined() {
        check(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel|lo\r\n6;note=x\r\n world\r|\n0\r\nx-trailer: 1\r\n\r\n",
            expect![[r#"
                200 text/event-stream
                read "hel"
                read "lo world"
                end
                kept true
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn one_read_takes_every_chunk_that_arrived() {
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n|7\r\ndata: 1\r\n7\r\ndata: 2\r\n7\r\ndata: 3\r\n|0\r\n\r\n",
            expect![[r#"
                200 -
                read "data: 1data: 2data: 3"
                end
                kept true
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn a_content_length_body_ends_at_its_length() {
        check(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"error\"|:1}",
            expect![[r#"
                400 application/json
                read "{\"error\""
                read ":1}"
                end
                kept true
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn an_http10_body_ends_when_the_engine_closes() {
        // As Python's http.server answers (mlx_lm.server, the toy stand-in).
        check(
            "HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\n|data: [DONE]\n\n#close",
            expect![[r#"
                200 text/event-stream
                read "data: 1\\n\\n"
                read "data: [DONE]\\n\\n"
                end
                kept false
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn connection_close_is_not_kept() {
        check(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok#close",
            expect![[r#"
                200 -
                read "ok"
                end
                kept false
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn an_interim_answer_is_skipped() {
        check(
            "HTTP/1.1 100 Continue\r\n\r\n|HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            expect![[r#"
                200 -
                read "ok"
                end
                kept true
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn broken_answers_are_errors() {
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel#close",
            expect![[r#"
                200 -
                read "hel"
                error: error reading a body from connection: end of file before message length reached
                kept false
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            expect![[r#"
                200 -
                error: error reading a body from connection: Invalid chunk size line: missing size digit
                kept false
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhello\r\n",
            expect![[r#"
                200 -
                read "he"
                error: error reading a body from connection: Invalid chunk body CR
                kept false
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel#close",
            expect![[r#"
                200 -
                read "hel"
                error: error reading a body from connection: end of file before message length reached
                kept false
            "#]],
        )
        .await;
        check(
            "#close",
            expect![[r#"
                error: connection closed before message completed
                kept false
            "#]],
        )
        .await;
        check(
            "SPDY/3 200 OK\r\n\r\n",
            expect![[r#"
                error: invalid HTTP version parsed
                kept false
            "#]],
        )
        .await;
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    async fn served(connections: &Arc<Connections>) -> String {
        let answer = connections.post("/", "{}".into()).await.unwrap();
        String::from_utf8(answer.into_body().bytes().await.unwrap().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_kept_connection_serves_the_next_request() {
        let (connections, accepted) = engine(&[OK, OK, OK]).await;
        for _ in 0..3 {
            assert_eq!(served(&connections).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_kept_connection_the_engine_closed_is_replaced() {
        // Closed after its answer, although it said keep-alive: the next
        // request sees the close before it is sent.
        let closed = format!("{OK}#close");
        let (connections, accepted) = engine(&[&closed, OK]).await;
        assert_eq!(served(&connections).await, "ok");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(served(&connections).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_the_engine_closed_on_unanswered_goes_again() {
        // The engine reads the second request, then closes the connection
        // without a byte of answer (its idle timeout, racing the request).
        let (connections, accepted) = engine(&[OK, "#close", OK]).await;
        assert_eq!(served(&connections).await, "ok");
        assert_eq!(served(&connections).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (connections, accepted) =
            engine(&["HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nok", OK]).await;
        let answer = connections.post("/", "{}".into()).await.unwrap();
        drop(answer);
        assert_eq!(served(&connections).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
