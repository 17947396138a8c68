//! Health that knows: the `beta` plugin runs the unruly stand-in engine
//! (tests/stand-ins/unruly_engine.py), which turns unhealthy on request,
//! answers slowly, or is stopped with SIGSTOP; the host must tell failed,
//! busy and hung apart, fail requests with a clear error, and start the
//! engine afresh.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve::{beta_plugin, eventually, pid_of, Server};

/// A server whose `tiny` model is served by the unruly stand-in, with
/// short serving timeouts.
fn unruly() -> Server {
    Server::with(|s| {
        beta_plugin(s, "[\"python3\"]", "");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/stand-ins/unruly_engine.py")
            .canonicalize()
            .unwrap();
        s.config(&format!(
            "[plugins.beta]\nscript = \"{}\"\nallow_programs = [\"python3\"]\n",
            script.display()
        ));
        s.settings(
            "[serving]\nfirst_byte_timeout_ms = 600\nstream_idle_timeout_ms = 600\n\
             check_timeout_ms = 300\nhealth_poll_ms = 100\n",
        );
    })
}

fn chat(server: &Server, content: &str) -> (u16, Value) {
    server.post(
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": content}]}),
    )
}

fn model_state(server: &Server) -> Value {
    server.get("/health").1["models"]["tiny"]["state"].clone()
}

fn signal(name: &str, pid: u64) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[test]
fn a_failed_readiness_status_fails_the_session_and_the_next_request_restarts_it() {
    let server = unruly();
    let pid = pid_of(&server.load());
    // The engine's 404 "generation thread died" is the engine's failure,
    // not the client's: a 502 that says what the engine answered.
    let (status, body) = chat(&server, "POISON");
    assert_eq!(status, 502, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("404") && message.contains("generation thread died"),
        "{message}"
    );
    eventually("the failed state", Duration::from_secs(10), || {
        model_state(&server) == "failed"
    });
    assert_eq!(server.events("failed"), 1);
    let (_, health) = server.get("/health");
    let reason = health["models"]["tiny"]["reason"].as_str().unwrap();
    assert!(reason.contains("/health answered 503"), "{reason}");
    eventually("the failed engine's end", Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    // The next request starts the engine afresh and is served.
    let (status, body) = chat(&server, "hello");
    assert_eq!(status, 200, "{body}");
    assert_eq!(model_state(&server), "ready");
    assert_ne!(pid_of(&server.load()), pid);
}

#[test]
fn a_stopped_engine_is_hung_killed_and_recorded() {
    let server = unruly();
    let pid = pid_of(&server.load());
    signal("STOP", pid);
    let start = Instant::now();
    let (status, body) = chat(&server, "hello");
    let took = start.elapsed();
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "engine_hung", "{body}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.events("hung"), 1);
    assert_eq!(model_state(&server), "hung");
    eventually("the hung engine's end", Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    let (status, body) = chat(&server, "hello");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_slow_engine_that_answers_is_busy_not_hung() {
    let server = unruly();
    server.load();
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| chat(&server, "SLOW 1.5"));
        eventually("the busy state", Duration::from_secs(2), || {
            server.get("/api/sessions").1["sessions"][0]["state"] == "busy"
        });
        let (status, body) = slow.join().unwrap();
        assert_eq!(status, 200, "{body}");
    });
    assert_eq!(server.events("hung"), 0);
    assert_eq!(model_state(&server), "ready");
}

/// Streams one chat of `max_tokens` tokens; returns the status and the
/// data events that carried a token or an error.
fn stream(server: &Server, max_tokens: u32) -> (u16, Vec<String>) {
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({
            "model": "tiny", "stream": true, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "go"}],
        }))
        .timeout(Duration::from_secs(30))
        .send()
        .unwrap();
    let status = response.status().as_u16();
    let events = BufReader::new(response)
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.starts_with("data: {"))
        .collect();
    (status, events)
}

/// Regression (issue 30): at 64 concurrent streams the health poll took a
/// 503 from mlx_lm.server's readiness route for a failure and killed the
/// engine with every client on it. An engine that answers 503 while it
/// streams tokens is busy: three times its batch of streams all finish,
/// the session shows `busy` meanwhile, and nothing is failed or restarted.
#[test]
fn an_engine_that_answers_503_while_it_streams_is_busy_not_failed() {
    let server = unruly();
    let pid = pid_of(&server.load());
    let (status, body) = chat(&server, "BUSY503");
    assert_eq!(status, 200, "{body}");
    std::thread::scope(|scope| {
        // The stand-in streams 4 at a time; 12 keep it full for 3 rounds.
        let streams: Vec<_> = (0..12)
            .map(|_| scope.spawn(|| stream(&server, 40)))
            .collect();
        eventually("the busy state", Duration::from_secs(5), || {
            model_state(&server) == "busy"
        });
        for s in streams {
            let (status, events) = s.join().unwrap();
            assert_eq!(status, 200);
            assert_eq!(events.len(), 40, "{:?}", events.last());
            assert!(events.iter().all(|e| !e.contains("error")), "{events:?}");
        }
    });
    assert_eq!(
        server.events("failed"),
        0,
        "{:?}",
        server.event_log("failed")
    );
    eventually("the ready state", Duration::from_secs(5), || {
        model_state(&server) == "ready"
    });
    assert_eq!(pid_of(&server.load()), pid);
    // With no stream on it, the same 503 is a failure again.
    let (status, _) = chat(&server, "POISON");
    assert_ne!(status, 200);
    eventually("the failed state", Duration::from_secs(10), || {
        server.events("failed") == 1
    });
}

#[test]
fn a_stream_that_goes_silent_on_a_stopped_engine_ends_with_a_hung_error() {
    let server = unruly();
    let pid = pid_of(&server.load());
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({
            "model": "tiny", "stream": true, "max_tokens": 200,
            "messages": [{"role": "user", "content": "go"}],
        }))
        .timeout(Duration::from_secs(10))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut lines = BufReader::new(response).lines().map_while(Result::ok);
    assert!(lines.next().unwrap().starts_with("data: "));
    signal("STOP", pid);
    let last = lines.filter(|l| l.starts_with("data: ")).last().unwrap();
    assert!(last.contains("engine_hung"), "{last}");
    assert_eq!(server.events("hung"), 1);
}

#[test]
fn metrics_count_requests_tokens_timings_events_and_memory() {
    let server = unruly();
    let (status, _) = chat(&server, "hello");
    assert_eq!(status, 200);
    let streamed = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({
            "model": "tiny", "stream": true, "max_tokens": 3,
            "messages": [{"role": "user", "content": "go"}],
        }))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(streamed.contains("[DONE]"), "{streamed}");
    let (status, _) = server.post(
        "/v1/chat/completions",
        json!({"model": "tiny", "stop": 5, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(status, 400);
    let response = reqwest::blocking::get(format!("{}/metrics", server.url)).unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().unwrap();
    // Series within a family come in no set order.
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("_bucket{"))
        .filter(|l| !l.contains("_sum{") && !l.starts_with("hangar_session_resident_bytes"))
        // Estimated until the scheduler's next memory sample, measured after.
        .filter(|l| !l.starts_with("hangar_memory_used_bytes"))
        .collect();
    lines.sort();
    expect_test::expect![[r#"
        hangar_inter_token_seconds_count{model="tiny"} 2
        hangar_memory_pressure{guard="off"} 0
        hangar_model_state{model="tiny",state="ready"} 1
        hangar_queued_requests{model="tiny"} 0
        hangar_requests_in_flight{model="tiny"} 0
        hangar_requests_total{model="tiny",route="/v1/chat/completions",status="200"} 2
        hangar_requests_total{model="tiny",route="/v1/chat/completions",status="400"} 1
        hangar_session_events_total{model="tiny",kind="loaded"} 1
        hangar_time_to_first_token_seconds_count{model="tiny"} 1
        hangar_tokens_total{model="tiny",kind="completion"} 7
        hangar_tokens_total{model="tiny",kind="prompt"} 1"#]]
    .assert_eq(&lines.join("\n"));
    let resident = text
        .lines()
        .find(|l| l.starts_with("hangar_session_resident_bytes{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(resident > 1_000_000, "engine memory not measured: {text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("hangar_memory_used_bytes ")),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn a_serving_setting_of_zero_in_settings_toml_stops_the_host_at_start() {
    let s = crate::fixtures::Scenario::new();
    crate::serve::model(&s, "tiny", 0);
    s.settings("[serving]\nhealth_poll_ms = 0\n");
    let models = s.root.path().join("models");
    let (code, out) = s.hangar(&[
        "serve",
        "--port",
        "0",
        "--model-dir",
        models.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("serving.health_poll_ms must be a positive number of milliseconds, not 0"),
        "{out}"
    );
}
