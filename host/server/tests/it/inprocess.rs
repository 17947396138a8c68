//! In-process engines: the example `echo` plugin runs inference itself, so
//! the host serves it through a `hangar worker` child process (or, with
//! `isolation = "none"`, inside the host), with the same OpenAI routes,
//! streaming, errors and crash handling as an engine process.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{json, Value};

use crate::fixtures::{manifest, Scenario, ECHO_EXTRA};
use crate::serve::{alive, eventually, kill9, pid_of, Server};

pub fn echo(s: &Scenario, isolation: Option<&str>) {
    s.plugin(
        "echo",
        &manifest("echo", "engine_echo", &["mlx"], 50, ECHO_EXTRA),
        Some("engine_echo"),
    );
    match isolation {
        Some(mode) => s.config(&format!("[plugins.echo]\nisolation = \"{mode}\"\n")),
        None => s.config(""),
    }
}

fn chat(server: &Server, content: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": content}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    server.post("/v1/chat/completions", body)
}

/// The data lines of a streamed answer, read to its end.
fn stream(server: &Server, content: &str, max_tokens: u32) -> Vec<Value> {
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({
            "model": "tiny", "stream": true, "max_tokens": max_tokens,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": content}],
        }))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    BufReader::new(response)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .map(|d| serde_json::from_str(&d).unwrap_or(Value::String(d)))
        .collect()
}

#[test]
fn a_worker_serves_chat_and_streams_like_any_engine() {
    let server = Server::with(|s| echo(s, None));
    let (status, body) = chat(&server, "one two three", json!({"max_tokens": 5}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "tiny");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "one two three one two "
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let (_, body) = chat(&server, "a b c", json!({"max_tokens": 10, "stop": "c"}));
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let events = stream(&server, "alpha beta", 3);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "alpha beta alpha ");
    assert_eq!(events.last().unwrap(), &Value::String("[DONE]".into()));
    let usage = &events[events.len() - 2]["usage"];
    assert_eq!(usage["completion_tokens"], 3);
    assert!(events
        .iter()
        .any(|e| e["choices"][0]["finish_reason"] == "length"));

    let (_, sessions) = server.get("/api/sessions");
    let session = &sessions["sessions"][0];
    assert_eq!(session["plugin"], "echo");
    assert!(session["endpoint"]
        .as_str()
        .unwrap()
        .starts_with("http://127.0.0.1:"));
    assert!(alive(pid_of(session)), "the worker is a process of its own");
}

#[test]
fn a_client_that_hangs_up_stops_generation() {
    let server = Server::with(|s| echo(s, None));
    let session = server.load();
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(
            &json!({"model": "tiny", "stream": true, "max_tokens": 100000,
                      "messages": [{"role": "user", "content": "go on and on"}]}),
        )
        .send()
        .unwrap();
    let mut lines = BufReader::new(response).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: "));
    drop(lines); // hang up after the first event
    let logs = format!("/api/sessions/{}/logs", session["id"].as_str().unwrap());
    eventually("the engine's cancellation", Duration::from_secs(5), || {
        server.get(&logs).1["lines"]
            .to_string()
            .contains("generation cancelled by the client")
    });
    eventually("the request's end", Duration::from_secs(10), || {
        server.get("/api/sessions").1["sessions"][0]["in_flight"] == 0
    });
}

#[test]
fn a_crashing_worker_is_cleaned_up_like_any_engine() {
    let server = Server::with(|s| echo(s, None));
    let pid = pid_of(&server.load());
    let (status, body) = chat(&server, "please CRASH now", json!({}));
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited unexpectedly"),
        "{body}"
    );
    eventually("the session's removal", Duration::from_secs(10), || {
        server.get("/api/sessions").1["sessions"] == json!([])
    });
    assert!(!alive(pid));
    assert_eq!(server.events("crashed"), 1);
    let (status, _) = chat(&server, "fine again", json!({"max_tokens": 2}));
    assert_eq!(status, 200);
}

#[test]
fn isolation_none_runs_the_engine_inside_the_host() {
    let server = Server::with(|s| echo(s, Some("none")));
    let (status, body) = chat(&server, "in the host", json!({"max_tokens": 3}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "in the host ");
    let (_, sessions) = server.get("/api/sessions");
    assert_eq!(sessions["sessions"][0]["endpoint"], "in-process");
    assert_eq!(sessions["sessions"][0]["pid"], Value::Null);
    let events = stream(&server, "x y", 2);
    assert_eq!(events.last().unwrap(), &Value::String("[DONE]".into()));
    let _ = kill9; // (crashes in-process take the host down by design)
}

/// What an engine decided at load (plugin-api 1.6 notes) shows with its
/// session and as an `engine_note` event, from a worker and from an engine
/// inside the host alike.
#[test]
fn an_engines_notes_show_with_its_session_and_as_events() {
    for isolation in [None, Some("none")] {
        let server = Server::with(|s| {
            echo(s, isolation);
            let model = s.root.path().join("models").join("tiny");
            std::fs::create_dir_all(&model).unwrap();
            std::fs::write(model.join("echo-note.txt"), "the draft model is not used\n").unwrap();
        });
        let (status, body) = chat(&server, "hello", json!({"max_tokens": 1}));
        assert_eq!(status, 200, "{isolation:?}: {body}");
        let (_, sessions) = server.get("/api/sessions");
        let notes = &sessions["sessions"][0]["notes"];
        assert!(
            notes
                .as_array()
                .unwrap()
                .contains(&json!("the draft model is not used")),
            "{isolation:?}: {notes}"
        );
        let (_, events) = server.get("/api/events");
        let note = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "engine_note")
            .unwrap_or_else(|| panic!("{isolation:?}: no engine_note in {events}"));
        assert_eq!(note["model"], "tiny");
        assert_eq!(note["message"], "the draft model is not used");
    }
}
