//! The HTTP/1.1 client the proxy reaches an engine's loopback endpoint
//! with: one request per connection at a time, connections kept open
//! between requests, and an answer's body read by whoever holds it, in its
//! own task.
//!
//! reqwest (which the readiness checks still use) reads a body in a task
//! of its own and hands it over one HTTP chunk at a time through a channel
//! that holds one chunk. An engine sends one server-sent event per chunk,
//! so a streamed answer cost the host a task wake-up, a socket read and
//! (downstream) a socket write per token, whatever had already arrived.
//! Here the relay reads the socket itself: one read takes every chunk the
//! engine has written since the last (up to [`READ_SIZE`]),
//! [`Body::read`] undoes the chunked framing into one run of bytes, and
//! the client gets them in one write. A read is never held back for more
//! to arrive, so a paced stream's token leaves as soon as it comes.
//!
//! The body is read only when its holder asks, so a client that reads
//! slowly leaves the engine waiting on its own socket; dropping a
//! [`Body`] before its end closes the connection, which is how an engine
//! learns that its client went away.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How many bytes one read may take: about ten events of a chat stream.
/// Larger reads save few system calls more, and let one stream with a
/// backlog (an unpaced engine, a host that fell behind) hold its worker
/// thread longer while other streams wait for their first token. In the
/// proxy bench's 64 unpaced streams that split reasoning, the median
/// added time to first token was 41–57 ms with 16 KiB reads, and 8–14 ms
/// with these and the turn a relay with more waiting gives the others
/// (2–26 ms for the relay before, which read one event at a time).
const READ_SIZE: usize = 4 * 1024;

/// The longest answer head (status line and headers) taken.
const MAX_HEAD: usize = 64 * 1024;

/// The longest chunk-size line or trailer line taken.
const MAX_LINE: usize = 4 * 1024;

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
    authority: String,
    connect_timeout: Duration,
    /// Most recently used last: the one taken next is the least likely
    /// to have been closed by the engine's own idle timeout.
    idle: Mutex<Vec<(TcpStream, Instant)>>,
}

/// An engine's answer: its status and headers, and its body, unread.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, read through [`Body::read`] or [`Body::bytes`].
    pub body: Body,
}

/// An answer's body, read from the connection as its holder asks.
#[derive(Debug)]
pub(crate) struct Body {
    /// `None` once the body has ended (and the connection gone back to
    /// its pool, or closed).
    stream: Option<TcpStream>,
    /// Bytes read from the socket and not yet decoded.
    raw: BytesMut,
    framing: Framing,
    /// Where the connection goes once the body has ended, if the engine
    /// keeps it open.
    pool: Option<Arc<Connections>>,
    /// A fault found after bytes that were passed on first.
    broken: Option<io::Error>,
    /// Whether the last socket read took all it could.
    filled: bool,
}

/// How the body's end is known (RFC 9112, section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `content-length`: this many bytes are left.
    Length(u64),
    /// `transfer-encoding: chunked`, at this point of a chunk.
    Chunked(Chunk),
    /// Neither: the body ends when the engine closes the connection.
    UntilClose,
    /// The whole body has been read.
    Done,
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// Expecting the line end after a chunk's data.
    DataEnd,
    /// After the last (empty) chunk: trailer lines until an empty one.
    Trailers,
}

/// Why a request on a kept connection failed.
enum Failed {
    /// Before any byte of an answer came: the engine had closed the
    /// connection, and the request may go again on a fresh one.
    Unanswered(io::Error),
    /// Anything else.
    Other(io::Error),
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
            authority: authority.to_string(),
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }))
    }

    /// Sends `POST path` with the JSON `body` and returns the answer once
    /// its head has arrived.
    pub(crate) async fn post(self: &Arc<Self>, path: &str, body: &[u8]) -> io::Result<Answer> {
        let request = self.request(path, body);
        if let Some(stream) = self.take_idle() {
            match self.exchange(stream, &request).await {
                Ok(answer) => return Ok(answer),
                // The engine closed a kept connection as the request went
                // out; it answered nothing, so nothing was served twice.
                Err(Failed::Unanswered(_)) => {}
                Err(Failed::Other(e)) => return Err(e),
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
        match self.exchange(stream, &request).await {
            Ok(answer) => Ok(answer),
            Err(Failed::Unanswered(e) | Failed::Other(e)) => Err(e),
        }
    }

    fn request(&self, path: &str, body: &[u8]) -> Vec<u8> {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\naccept: */*\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.authority,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        request
    }

    /// Writes `request` on `stream` and reads the answer's head.
    async fn exchange(
        self: &Arc<Self>,
        mut stream: TcpStream,
        request: &[u8],
    ) -> Result<Answer, Failed> {
        if let Err(e) = stream.write_all(request).await {
            return Err(Failed::Unanswered(e));
        }
        let mut raw = BytesMut::with_capacity(READ_SIZE);
        let mut answered = false;
        loop {
            if let Some((head, length)) = parse_head(&raw).map_err(Failed::Other)? {
                raw.advance(length);
                // An interim answer (100 Continue, 103 Early Hints) comes
                // before the real one.
                if head.status.is_informational() {
                    continue;
                }
                let (framing, keep) = framing(&head);
                return Ok(Answer {
                    status: head.status,
                    headers: head.headers,
                    body: Body {
                        stream: Some(stream),
                        raw,
                        framing,
                        pool: keep.then(|| self.clone()),
                        broken: None,
                        filled: false,
                    },
                });
            }
            if raw.len() > MAX_HEAD {
                return Err(Failed::Other(invalid(format!(
                    "the engine's answer headers exceed {MAX_HEAD} bytes"
                ))));
            }
            match stream.read_buf(&mut raw).await {
                Ok(0) if !answered => {
                    return Err(Failed::Unanswered(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the engine closed the connection without answering",
                    )))
                }
                Ok(0) => {
                    return Err(Failed::Other(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the engine closed the connection in the middle of its answer's headers",
                    )))
                }
                Err(e) if !answered && e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(Failed::Unanswered(e))
                }
                Err(e) => return Err(Failed::Other(e)),
                Ok(_) => answered = true,
            }
        }
    }

    /// A kept connection the engine has not closed, if there is one.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut idle = self.idle.lock().expect("the pool's lock is never poisoned");
        while let Some((stream, since)) = idle.pop() {
            if since.elapsed() > IDLE_FOR {
                continue;
            }
            // A closed connection reads its end (or stray bytes) at once;
            // a live one has nothing to read.
            let mut probe = [0u8; 1];
            if matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            {
                return Some(stream);
            }
        }
        None
    }

    fn keep(&self, stream: TcpStream) {
        let mut idle = self.idle.lock().expect("the pool's lock is never poisoned");
        idle.retain(|(_, since)| since.elapsed() <= IDLE_FOR);
        if idle.len() < MAX_IDLE {
            idle.push((stream, Instant::now()));
        }
    }
}

/// A parsed answer head.
struct Head {
    status: StatusCode,
    headers: HeaderMap,
    /// HTTP/1.1 (else 1.0).
    http11: bool,
}

/// The head at the start of `raw` and its length, or `None` when it has
/// not all arrived.
fn parse_head(raw: &[u8]) -> io::Result<Option<(Head, usize)>> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut fields);
    let length = match response.parse(raw) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(invalid(format!("the engine's answer is not HTTP/1.1: {e}"))),
    };
    let status = response
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| invalid("the engine's answer has no valid status".to_string()))?;
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes());
        let value = HeaderValue::from_bytes(field.value);
        if let (Ok(name), Ok(value)) = (name, value) {
            headers.append(name, value);
        }
    }
    let head = Head {
        status,
        headers,
        http11: response.version == Some(1),
    };
    Ok(Some((head, length)))
}

/// How the body after `head` ends, and whether the connection can carry
/// another request after it.
fn framing(head: &Head) -> (Framing, bool) {
    let tokens = |name: &str| {
        head.headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect::<Vec<_>>()
    };
    let keep = head.http11 && !tokens("connection").iter().any(|t| t == "close");
    if head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED {
        return (Framing::Done, keep);
    }
    let encodings = tokens("transfer-encoding");
    if let Some(last) = encodings.last() {
        return match last.as_str() {
            "chunked" => (Framing::Chunked(Chunk::Size), keep),
            _ => (Framing::UntilClose, false),
        };
    }
    let length = head
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(0) => (Framing::Done, keep),
        Some(n) => (Framing::Length(n), keep),
        None => (Framing::UntilClose, false),
    }
}

impl Body {
    /// Appends the next bytes of the body to `out`: everything the engine
    /// has sent that one socket read brings, without its chunked framing.
    /// Returns `false`, adding nothing, once the body has ended.
    ///
    /// Cancel-safe: dropped while it waits, it has taken nothing from the
    /// socket that a later call would not find.
    pub(crate) async fn read(&mut self, out: &mut BytesMut) -> io::Result<bool> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        loop {
            let before = out.len();
            let decoded = self.decode(out);
            let grew = out.len() > before;
            match decoded {
                // What came before the fault goes first.
                Err(e) if grew => {
                    self.broken = Some(e);
                    return Ok(true);
                }
                Err(e) => return Err(e),
                Ok(()) if grew => return Ok(true),
                Ok(()) => {}
            }
            if self.framing == Framing::Done {
                self.end();
                return Ok(false);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Ok(false);
            };
            self.raw.reserve(READ_SIZE);
            let n = stream
                .read_buf(&mut (&mut self.raw).limit(READ_SIZE))
                .await?;
            self.filled = n == READ_SIZE;
            if n == 0 {
                self.stream = None;
                if self.framing != Framing::UntilClose {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the engine closed the connection before its answer ended",
                    ));
                }
                self.framing = Framing::Done;
            }
        }
    }

    /// Whether the last read of the socket took as much as one read may:
    /// the engine had sent more than that, and more is likely waiting.
    pub(crate) fn more_waiting(&self) -> bool {
        self.filled
    }

    /// The whole body.
    pub(crate) async fn bytes(mut self) -> io::Result<bytes::Bytes> {
        let mut out = BytesMut::new();
        while self.read(&mut out).await? {}
        Ok(out.freeze())
    }

    /// Moves what `raw` holds of the body into `out`, as far as it goes.
    fn decode(&mut self, out: &mut BytesMut) -> io::Result<()> {
        loop {
            match self.framing {
                Framing::Done => return Ok(()),
                Framing::UntilClose => {
                    out.extend_from_slice(&self.raw);
                    self.raw.clear();
                    return Ok(());
                }
                Framing::Length(left) => {
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(self.raw.len());
                    out.extend_from_slice(&self.raw[..n]);
                    self.raw.advance(n);
                    let left = left - n as u64;
                    self.framing = match left {
                        0 => Framing::Done,
                        _ => Framing::Length(left),
                    };
                    return Ok(());
                }
                Framing::Chunked(Chunk::Data(left)) => {
                    if self.raw.is_empty() {
                        return Ok(());
                    }
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(self.raw.len());
                    out.extend_from_slice(&self.raw[..n]);
                    self.raw.advance(n);
                    let left = left - n as u64;
                    self.framing = Framing::Chunked(match left {
                        0 => Chunk::DataEnd,
                        _ => Chunk::Data(left),
                    });
                }
                Framing::Chunked(chunk) => {
                    let line = match chunk {
                        Chunk::Size => self.line(chunk_size)?,
                        _ => self.line(|line| Ok(line.len() as u64))?,
                    };
                    let Some(line) = line else {
                        return Ok(());
                    };
                    self.framing = match chunk {
                        Chunk::Size => match line {
                            0 => Framing::Chunked(Chunk::Trailers),
                            n => Framing::Chunked(Chunk::Data(n)),
                        },
                        Chunk::DataEnd if line == 0 => Framing::Chunked(Chunk::Size),
                        Chunk::DataEnd => {
                            return Err(invalid(
                                "the engine's chunked answer has a chunk longer than its size"
                                    .to_string(),
                            ))
                        }
                        // A trailer field is read past; an empty line ends
                        // the body.
                        Chunk::Trailers if line == 0 => Framing::Done,
                        Chunk::Trailers => Framing::Chunked(Chunk::Trailers),
                        Chunk::Data(_) => unreachable!("handled above"),
                    };
                }
            }
        }
    }

    /// `read` of the next line of `raw` (without its line end: `\r\n`,
    /// or `\n` alone), the line then taken from `raw`; `None` while it has
    /// not all arrived. (A line is size digits or a trailer: read in place,
    /// never copied.)
    fn line(&mut self, read: impl FnOnce(&[u8]) -> io::Result<u64>) -> io::Result<Option<u64>> {
        let Some(end) = memchr::memchr(b'\n', &self.raw) else {
            if self.raw.len() > MAX_LINE {
                return Err(invalid(format!(
                    "the engine's chunked answer has a line over {MAX_LINE} bytes"
                )));
            }
            return Ok(None);
        };
        let line = &self.raw[..end];
        let value = read(line.strip_suffix(b"\r").unwrap_or(line))?;
        self.raw.advance(end + 1);
        Ok(Some(value))
    }

    /// The body has ended: its connection goes back to the pool if the
    /// engine keeps it and nothing follows the body, else it closes.
    fn end(&mut self) {
        let stream = self.stream.take();
        if let (Some(stream), Some(pool)) = (stream, self.pool.take()) {
            if self.raw.is_empty() {
                pool.keep(stream);
            }
        }
    }
}

/// The size of a chunk from its size line (hex digits, then optional
/// `;extensions`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let bad = || {
        invalid(format!(
            "the engine's chunked answer has a bad chunk size line {:?}",
            String::from_utf8_lossy(line)
        ))
    };
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad());
    }
    let text = std::str::from_utf8(digits).map_err(|_| bad())?;
    u64::from_str_radix(text, 16).map_err(|_| bad())
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use expect_test::{expect, Expect};
    use tokio::io::AsyncBufReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// An engine that answers each request on a connection with the next
    /// of `answers`, written piece by piece (pieces separated by `|`, a
    /// pause between them); an answer ending in `#close` closes the
    /// connection after it, and one that is only `#close` closes it
    /// without answering. Returns its connections and its address.
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
        match connections.post("/v1/chat/completions", b"{}").await {
            Err(e) => out.push_str(&format!("error: {e}\n")),
            Ok(mut answer) => {
                let kind = answer
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok());
                out.push_str(&format!(
                    "{} {}\n",
                    answer.status.as_u16(),
                    kind.unwrap_or("-")
                ));
                let mut read = BytesMut::new();
                loop {
                    match answer.body.read(&mut read).await {
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
        let kept = connections.idle.lock().unwrap().len();
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
                kept 1
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
                kept 1
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
                kept 1
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
                kept 0
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
                kept 0
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
                kept 1
            "#]],
        )
        .await;
    }

    #[tokio::test]
    async fn broken_bodies_are_errors() {
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel#close",
            expect![[r#"
                200 -
                read "hel"
                error: the engine closed the connection before its answer ended
                kept 0
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            expect![[r#"
                200 -
                error: the engine's chunked answer has a bad chunk size line "zz"
                kept 0
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhello\r\n",
            expect![[r#"
                200 -
                read "he"
                error: the engine's chunked answer has a chunk longer than its size
                kept 0
            "#]],
        )
        .await;
        check(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel#close",
            expect![[r#"
                200 -
                read "hel"
                error: the engine closed the connection before its answer ended
                kept 0
            "#]],
        )
        .await;
        check(
            "#close",
            expect![[r#"
                error: the engine closed the connection without answering
                kept 0
            "#]],
        )
        .await;
        check(
            "SPDY/3 200 OK\r\n\r\n",
            expect![[r#"
                error: the engine's answer is not HTTP/1.1: invalid HTTP version
                kept 0
            "#]],
        )
        .await;
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    async fn served(connections: &Arc<Connections>) -> String {
        let answer = connections.post("/", b"{}").await.unwrap();
        String::from_utf8(answer.body.bytes().await.unwrap().to_vec()).unwrap()
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
        let answer = connections.post("/", b"{}").await.unwrap();
        drop(answer);
        assert_eq!(served(&connections).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
