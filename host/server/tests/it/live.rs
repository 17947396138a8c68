//! The live feeds (`GET /api/events/stream`, `GET /api/sessions/{id}/logs/stream`)
//! and the `/admin` page's assets: what is kept comes first, then each new
//! item; a log stream ends with its session, every stream with the host;
//! the page is public while the feeds need the key.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixtures::manifest;
use crate::serve::Server;

/// An open server-sent-event stream, read event by event.
struct Feed(BufReader<reqwest::blocking::Response>);

impl Feed {
    fn open(server: &Server, path: &str) -> Feed {
        let response = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
            .get(format!("{}{path}", server.url))
            .send()
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let kind = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(kind, "text/event-stream", "{path}");
        Feed(BufReader::new(response))
    }

    /// The next event's `data`, or `None` when the stream ended.
    fn next(&mut self) -> Option<String> {
        let mut data = Vec::new();
        loop {
            let mut line = String::new();
            if self.0.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() && !data.is_empty() {
                return Some(data.join("\n"));
            }
            if let Some(d) = line.strip_prefix("data:") {
                data.push(d.trim_start().to_string());
            }
        }
    }

    /// The next event, as JSON.
    fn json(&mut self) -> Value {
        serde_json::from_str(&self.next().expect("the stream goes on")).unwrap()
    }
}

#[test]
fn the_event_stream_sends_what_happened_then_what_happens_and_ends_with_the_host() {
    let mut server = Server::start("[\"python3\"]");
    server.load();
    let mut feed = Feed::open(&server, "/api/events/stream");
    let loaded = feed.json();
    assert_eq!(
        (loaded["kind"].as_str(), loaded["model"].as_str()),
        (Some("loaded"), Some("tiny"))
    );
    let (status, body) = server.post("/api/models/tiny/unload", json!({}));
    assert_eq!(status, 200, "{body}");
    let unloaded = feed.json();
    assert_eq!(unloaded["kind"], "unloaded", "{unloaded}");
    // SIGTERM: the stream ends and the host does not wait on it.
    let sent = Instant::now();
    Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(feed.next(), None);
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            sent.elapsed() < Duration::from_secs(8),
            "the host outlived its stream"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_log_stream_follows_its_engine_and_ends_with_its_session() {
    let server = Server::start("[\"python3\"]");
    let id = server.load()["id"].as_str().unwrap().to_string();
    let mut feed = Feed::open(&server, &format!("/api/sessions/{id}/logs/stream"));
    // Python's http.server logs each readiness poll on stderr.
    let line: String = serde_json::from_str(&feed.next().unwrap()).unwrap();
    assert!(line.starts_with("[std"), "{line}");
    server.post("/api/models/tiny/unload", json!({}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while feed.next().is_some() {
        assert!(
            Instant::now() < deadline,
            "the log stream outlived its session"
        );
    }
    let (status, body) = server.get(&format!("/api/sessions/{id}/logs/stream"));
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["error"]["message"],
        format!("no running session '{id}'; GET /api/sessions lists them")
    );
}

#[test]
fn the_admin_page_is_public_and_its_feeds_need_the_key() {
    let server = Server::with_args(
        |s| {
            let probe = s.engine_program("beta-engine", "beta 0.9.0");
            let extra = format!("[probe]\nprogram = \"{}\"\n", probe.display());
            s.plugin(
                "beta",
                &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
                Some("engine_beta"),
            );
            s.config("");
        },
        &["--api-key", "sekrit-key"],
    );
    for (path, kind) in [
        ("/admin", "text/html; charset=utf-8"),
        ("/admin/app.js", "text/javascript; charset=utf-8"),
        ("/admin/style.css", "text/css; charset=utf-8"),
    ] {
        let r = reqwest::blocking::get(format!("{}{path}", server.url)).unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], kind, "{path}");
        let policy = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(policy.starts_with("default-src 'self'"), "{policy}");
        assert!(!r.text().unwrap().is_empty(), "{path}");
    }
    for path in ["/api/events/stream", "/api/sessions/s1/logs/stream"] {
        assert_eq!(server.get(path).0, 401, "{path}");
    }
}
