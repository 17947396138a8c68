//! Regression tests for hostile input, each named after what it guards:
//! request fields refused at the edge, settings `settings.toml` cannot
//! hold, oversized bodies and undecodable paths, shutdown while a client
//! stalls, probes that leave children behind, and API keys.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixtures::{allow_python, make_executable, manifest, Scenario, ECHO_EXTRA};
use crate::serve::{alive, beta, beta_plugin, Server};

/// Posts `body` as raw text (for numbers `json!` cannot write, like 2^64).
fn raw(server: &Server, path: &str, body: String) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}{path}", server.url))
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

/// Each bad field, as the JSON text after the request's fixed part, and the
/// `param` the 400 must name.
const BAD_FIELDS: &[(&str, &str)] = &[
    (r#""stop": 5"#, "stop"),
    (r#""stop": [1]"#, "stop"),
    (r#""max_tokens": 1e300"#, "max_tokens"),
    (r#""max_tokens": 18446744073709551616"#, "max_tokens"),
    (r#""max_tokens": -5"#, "max_tokens"),
    (r#""max_tokens": 2.5"#, "max_tokens"),
    (r#""top_k": 1e300"#, "top_k"),
    (r#""top_k": 18446744073709551616"#, "top_k"),
    (r#""top_k": -5"#, "top_k"),
    (r#""top_k": 2.5"#, "top_k"),
    (r#""temperature": 3"#, "temperature"),
    (r#""top_p": -0.5"#, "top_p"),
];

fn refuses_each_bad_field(server: &Server) {
    let messages = r#""messages": [{"role": "user", "content": "hi"}]"#;
    for (field, param) in BAD_FIELDS {
        let body = format!(r#"{{"model": "tiny", {messages}, {field}}}"#);
        let (status, answer) = raw(server, "/v1/chat/completions", body);
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some(*param)),
            "{field}: {answer}"
        );
    }
    for messages in [r#"["hi"]"#, r#"[{"role": "user", "content": 5}]"#] {
        let body = format!(r#"{{"model": "tiny", "messages": {messages}}}"#);
        let (status, answer) = raw(server, "/v1/chat/completions", body);
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some("messages")),
            "{messages}: {answer}"
        );
    }
}

#[test]
fn bad_request_fields_are_refused_before_any_engine_loads() {
    let server = Server::start("[\"python3\"]");
    refuses_each_bad_field(&server);
    // Nothing was loaded for them: the edge refused them all.
    assert_eq!(server.events("loaded"), 0);
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
}

#[test]
fn bad_request_fields_are_refused_on_the_in_process_route_too() {
    let server = Server::with(|s| {
        s.plugin(
            "echo",
            &manifest("echo", "engine_echo", &["mlx"], 50, ECHO_EXTRA),
            Some("engine_echo"),
        );
        s.config("[plugins.echo]\nisolation = \"none\"\n");
    });
    server.load();
    refuses_each_bad_field(&server);
    // The engine still answers a good request after all of them.
    let (status, body) = server.post(
        "/v1/chat/completions",
        json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a b c"}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 2, "{body}");
}

#[test]
fn settings_toml_cannot_hold_are_a_422_at_check_time() {
    let server = Server::with(|s| {
        beta_plugin(
            s,
            "[\"python3\"]",
            "[[settings]]\nname = \"template_args\"\ntype = \"object\"\n\
             [[settings]]\nname = \"label\"\ntype = \"string\"\n\
             [[settings]]\nname = \"slots\"\ntype = \"integer\"\n",
        );
        s.config(&allow_python(&["beta"]));
    });
    let put = |path: &str, body: Value| {
        let r = reqwest::blocking::Client::new()
            .put(format!("{}{path}", server.url))
            .json(&body)
            .send()
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<Value>().unwrap_or(Value::Null),
        )
    };
    let cases = [
        (
            "/api/settings",
            json!({"defaults": {"max_tokens": u64::MAX}}),
            "beyond the largest whole number",
        ),
        (
            "/api/models/tiny/settings",
            json!({"slots": u64::MAX}),
            "beyond the largest whole number",
        ),
        (
            "/api/models/tiny/settings",
            json!({"template_args": {"enable_thinking": null}}),
            "null at enable_thinking",
        ),
        (
            "/api/settings",
            json!({"engines": {"beta": {"template_args": {"a": [1, null]}}}}),
            "null at a[1]",
        ),
        (
            "/api/models/tiny/settings",
            json!({"label": "x".repeat(5000)}),
            "strings of at most 4096",
        ),
    ];
    for (path, body, says) in cases {
        let (status, answer) = put(path, body.clone());
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 422, "{body}: {answer}");
        assert!(message.contains(says), "{body}: {message}");
    }
    // The store is unharmed: a good value is still accepted and kept.
    let (status, answer) = put("/api/models/tiny/settings", json!({"slots": 2}));
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn an_oversized_chat_body_and_a_non_utf8_path_get_openai_errors() {
    let server = Server::start("[\"python3\"]");
    let huge = format!(
        r#"{{"model": "tiny", "prompt": "{}"}}"#,
        "x".repeat(65 * 1024 * 1024)
    );
    for route in ["/v1/chat/completions", "/v1/completions"] {
        let (status, body) = raw(&server, route, huge.clone());
        assert_eq!(status, 413, "{route}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("larger than 64 MiB")),
            "{route}: {body}"
        );
    }
    for path in ["/api/models/%FF/settings", "/api/sessions/%C3%28/logs"] {
        let (status, body) = server.get(path);
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
}

fn term(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn exits_within(server: &mut Server, limit: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if server.child.try_wait().unwrap().is_some() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("hangar serve still ran {limit:?} after the signal");
}

#[test]
fn sigterm_ends_the_host_while_a_client_stalls_in_its_headers() {
    let mut server = Server::start("[\"python3\"]");
    let engine = crate::serve::pid_of(&server.load());
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut stalled = TcpStream::connect(&addr).unwrap();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    term(server.child.id());
    let took = exits_within(&mut server, Duration::from_secs(8));
    assert!(!alive(engine), "the engine outlived the host");
    eprintln!("exited {took:?} after SIGTERM");
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut server = Server::start("[\"python3\"]");
    let addr = server.url.trim_start_matches("http://").to_string();
    // A request whose body never comes keeps a connection busy.
    let mut stalled = TcpStream::connect(&addr).unwrap();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    term(server.child.id());
    std::thread::sleep(Duration::from_millis(300));
    term(server.child.id());
    exits_within(&mut server, Duration::from_secs(2));
}

/// A plugin whose probe program is the shell script `script`.
fn probing(s: &Scenario, script: &str, timeout_ms: u64) {
    let path = s.root.path().join("bin/beta-engine");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    make_executable(&path);
    let extra = format!(
        "[probe]\nprogram = \"{}\"\ntimeout_ms = {timeout_ms}\n",
        path.display()
    );
    s.plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        Some("engine_beta"),
    );
}

#[test]
fn a_probe_that_leaves_a_child_does_not_hold_the_listing() {
    let s = Scenario::new();
    probing(&s, "sleep 20 &\necho 'beta 1.0.0'", 5000);
    let start = Instant::now();
    let (code, out) = s.hangar(&["plugins"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1.0.0"), "{out}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_probe_timeout_kills_its_whole_process_group() {
    let s = Scenario::new();
    let pids = s.root.path().join("pids");
    probing(
        &s,
        &format!("sleep 30 &\necho $! > {}\nsleep 30", pids.display()),
        300,
    );
    let start = Instant::now();
    let (_, out) = s.hangar(&["plugins"]);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(out.contains("timed out") || out.contains("300"), "{out}");
    let child: u64 = std::fs::read_to_string(&pids)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed, if perhaps not yet reaped by whoever inherited it. SIGKILL
    // is delivered asynchronously: on a loaded machine the process may
    // take a moment to die, so the state is read until it has (or 2 s).
    let gone = |state: &str| {
        state.is_empty()
            || state
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut state = String::new();
    while Instant::now() < deadline {
        state = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
        if gone(&state) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        gone(&state),
        "the probe's child {child} outlived its timeout: {state}"
    );
}

#[test]
fn a_blank_api_key_is_refused() {
    let s = Scenario::new();
    std::fs::create_dir_all(s.root.path().join("models")).unwrap();
    let models = s.root.path().join("models").display().to_string();
    for key in [" ", "", "with space"] {
        let (code, out) = s.hangar(&[
            "serve",
            "--port",
            "0",
            "--model-dir",
            &models,
            "--api-key",
            key,
        ]);
        assert_ne!(code, 0, "{key:?}: {out}");
        assert!(out.contains("--api-key"), "{key:?}: {out}");
    }
}

#[test]
fn health_without_the_key_gives_the_status_only() {
    let server = Server::with_args(beta, &["--api-key", "sekrit-key"]);
    let keyed = |path: &str| {
        reqwest::blocking::Client::new()
            .get(format!("{}{path}", server.url))
            .bearer_auth("sekrit-key")
            .send()
            .unwrap()
            .json::<Value>()
            .unwrap()
    };
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/api/models/tiny/load", server.url))
        .bearer_auth("sekrit-key")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (status, anonymous) = server.get("/health");
    assert_eq!(status, 200);
    assert_eq!(anonymous, json!({"status": "healthy"}));
    let full = keyed("/health");
    assert_eq!(full["sessions"][0]["model"], "tiny", "{full}");
}
