//! Clients that stall, over real sockets: one that never reads its stream
//! (a 4 KiB receive buffer, never drained) and one that stops half-way
//! through its request body must not take a model from other clients;
//! each is cut off at `client_stall_timeout_ms` and recorded. A request
//! behind an engine busy with as many requests as it serves at once waits
//! no longer than `--queue-timeout`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use socket2::{Domain, Socket, Type};

use crate::inprocess::echo;
use crate::serve::{eventually, Server};

/// A client with a 4 KiB receive buffer that posts `body` to `path` and
/// never reads the answer.
fn never_reading(server: &Server, path: &str, body: &Value) -> TcpStream {
    let addr: SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: hangar\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// A client that sends the headers of a chat request and the start of
/// its body, then nothing more.
fn stalled_body(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: hangar\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"model\": \"tiny\", \"mess"
    )
    .unwrap();
    stream
}

/// A streamed chat request the echo engine would take minutes to answer.
fn endless() -> Value {
    json!({
        "model": "tiny", "stream": true, "max_tokens": 200000,
        "messages": [{"role": "user", "content": "on and on"}],
    })
}

fn in_flight(server: &Server) -> Value {
    server.get("/api/sessions").1["scheduler"]["in_flight"].clone()
}

fn metrics(server: &Server) -> String {
    reqwest::blocking::get(format!("{}/metrics", server.url))
        .unwrap()
        .text()
        .unwrap()
}

/// The scene: with a never-reading stream and a stalled body on
/// the model, another client's request is answered within a second; the
/// stream is then cut by the stall timeout, its slot freed, and both
/// stalls recorded.
fn others_are_served_while_clients_stall(isolation: Option<&str>) {
    let server = Server::with(|s| {
        echo(s, isolation);
        s.settings("[serving]\nclient_stall_timeout_ms = 2000\n");
    });
    server.load();
    let _reader = never_reading(&server, "/v1/chat/completions", &endless());
    eventually("the stream runs", Duration::from_secs(10), || {
        in_flight(&server) == 1
    });
    let mut body = stalled_body(&server);
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (status, answer) = server.post(
        "/v1/chat/completions",
        json!({"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "still here"}]}),
    );
    let took = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    assert!(took < Duration::from_secs(1), "answered in {took:?}");
    eprintln!("the other client's answer took {took:?}");

    let stalled_at = Instant::now();
    eventually("the stalls' records", Duration::from_secs(60), || {
        server.events("client_stalled") == 2
    });
    eprintln!(
        "the stalled stream was cut {:?} after the other answer",
        stalled_at.elapsed()
    );
    let mut log = server.event_log("client_stalled");
    log.sort();
    assert_eq!(
        log,
        [
            "-: the request body to /v1/chat/completions stopped arriving for 2000 ms (client_stall_timeout_ms); it was refused before it took a slot",
            "tiny: the client accepted no bytes of its answer for 2000 ms (client_stall_timeout_ms): its connection was cut, its request ended and its slot freed",
        ]
    );
    eventually(
        "the stream's slot is freed",
        Duration::from_secs(10),
        || in_flight(&server) == 0,
    );
    body.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = [0u8; 12];
    body.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 408");
    let metrics = metrics(&server);
    assert!(
        metrics.contains("hangar_session_events_total{model=\"tiny\",kind=\"client_stalled\"} 1"),
        "{metrics}"
    );
    // The model serves on.
    let (status, _) = server.post(
        "/v1/chat/completions",
        json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "again"}]}),
    );
    assert_eq!(status, 200);
}

#[test]
fn a_never_reading_client_and_a_stalled_body_leave_a_worker_model_to_others() {
    others_are_served_while_clients_stall(None);
}

#[test]
fn a_never_reading_client_and_a_stalled_body_leave_an_in_host_model_to_others() {
    others_are_served_while_clients_stall(Some("none"));
}

#[test]
fn a_request_behind_an_engine_at_its_concurrency_gets_429_at_the_queue_timeout() {
    // The echo engine serves two requests at once; two clients that never
    // read hold both (until the stall timeout, far away), so a third waits
    // in the scheduler's queue, and no longer than --queue-timeout.
    let server = Server::with_args(|s| echo(s, None), &["--queue-timeout", "1"]);
    server.load();
    let _first = never_reading(&server, "/v1/chat/completions", &endless());
    let _second = never_reading(&server, "/v1/chat/completions", &endless());
    eventually("both streams run", Duration::from_secs(10), || {
        in_flight(&server) == 2
    });
    let started = Instant::now();
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "me"}]}))
        .timeout(Duration::from_secs(30))
        .send()
        .unwrap();
    let took = started.elapsed();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let status = response.status().as_u16();
    let body: Value = response.json().unwrap();
    assert_eq!((status, retry.as_deref()), (429, Some("1")), "{body}");
    assert_eq!(body["error"]["code"], "queue_timeout", "{body}");
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
}
