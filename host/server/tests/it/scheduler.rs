//! The scheduler through `hangar serve`: admission (429 with Retry-After,
//! the queue, clients that leave it), residency (TTL, pins and `/health`,
//! eviction at `--max-loaded-models`, an unload that cancels a load) and
//! the memory guard's refusal.

use std::time::Duration;

use serde_json::{json, Value};

use crate::fixtures::{allow_python, manifest, Scenario};
use crate::inprocess::echo;
use crate::serve::{alive, beta, beta_plugin, eventually, kill9, model, pid_of, Server};

/// A chat request to `tiny` that the echo engine answers in about
/// `tokens` milliseconds.
fn chat(server: &Server, tokens: u32) -> reqwest::blocking::Response {
    reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&json!({
            "model": "tiny", "max_tokens": tokens,
            "messages": [{"role": "user", "content": "word"}],
        }))
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap()
}

/// The scheduler's part of `/api/sessions`.
fn scheduler(server: &Server) -> Value {
    server.get("/api/sessions").1["scheduler"].clone()
}

fn error(response: reqwest::blocking::Response) -> (u16, Option<String>, Value) {
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, response.json().unwrap_or(Value::Null))
}

/// The `alpha` plugin with an engine that takes `delay` seconds to start
/// (then serves `/health` from a folder with Python's http.server).
fn slow_alpha(s: &Scenario, delay: u32) {
    let program = s.root.path().join("bin/slow-engine");
    std::fs::create_dir_all(program.parent().unwrap()).unwrap();
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\n\
             [ \"$1\" = --model ] || {{ echo 'alpha 1.0.0'; exit 0; }}\n\
             sleep {delay}\n\
             mkdir -p www && echo ok > www/health && cd www\n\
             exec python3 -m http.server \"$4\" --bind 127.0.0.1\n"
        ),
    )
    .unwrap();
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&program)
        .status()
        .unwrap();
    assert!(status.success());
    let extra = format!(
        "[aliases]\nsafetensors = \"mlx\"\n[probe]\nprogram = \"{}\"\n[capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n",
        program.display()
    );
    s.plugin(
        "alpha",
        &manifest("alpha", "engine_alpha", &["mlx"], 20, &extra),
        Some("engine_alpha"),
    );
    s.config("");
}

/// The `beta` plugin (Python's http.server as the engine), allowed to
/// run `programs`.
fn beta_with(s: &Scenario, programs: &str) {
    beta_plugin(s, programs, "");
    s.config(&allow_python(&["beta"]));
}

#[test]
fn a_full_queue_answers_429_with_retry_after_and_waiters_are_served_in_turn() {
    let server = Server::with_args(
        |s| echo(s, None),
        &[
            "--max-concurrent-requests",
            "1",
            "--max-queued-requests",
            "1",
            "--queue-timeout",
            "30",
        ],
    );
    server.load();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| chat(&server, 2000).status().as_u16());
        eventually("the first request runs", Duration::from_secs(10), || {
            scheduler(&server)["in_flight"] == 1
        });
        let second = scope.spawn(|| chat(&server, 5).status().as_u16());
        eventually("the second request waits", Duration::from_secs(10), || {
            scheduler(&server)["queued"] == 1
        });
        let view = scheduler(&server);
        let tiny = &view["models"][0];
        assert_eq!(
            (
                tiny["model"].clone(),
                tiny["in_flight"].clone(),
                tiny["queued"].clone()
            ),
            (json!("tiny"), json!(1), json!(1)),
            "{view}"
        );
        assert!(tiny["oldest_wait_ms"].is_u64(), "{view}");
        let (status, retry, body) = error(chat(&server, 5));
        assert_eq!((status, retry.as_deref()), (429, Some("30")), "{body}");
        assert_eq!(body["error"]["code"], "queue_full");
        assert_eq!(first.join().unwrap(), 200);
        assert_eq!(second.join().unwrap(), 200);
    });
    let view = scheduler(&server);
    assert_eq!(
        (view["in_flight"].clone(), view["queued"].clone()),
        (json!(0), json!(0))
    );
    assert!(
        view["models"][0]["mean_wait_ms"].as_u64().unwrap() > 0,
        "{view}"
    );
}

#[test]
fn a_request_that_waits_past_the_queue_timeout_gets_429() {
    let server = Server::with_args(
        |s| echo(s, None),
        &["--max-concurrent-requests", "1", "--queue-timeout", "0.3"],
    );
    server.load();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| chat(&server, 2000).status().as_u16());
        eventually("the first request runs", Duration::from_secs(10), || {
            scheduler(&server)["in_flight"] == 1
        });
        let (status, retry, body) = error(chat(&server, 5));
        assert_eq!((status, retry.as_deref()), (429, Some("1")), "{body}");
        assert_eq!(body["error"]["code"], "queue_timeout");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--queue-timeout"),
            "{body}"
        );
        assert_eq!(first.join().unwrap(), 200);
    });
}

#[test]
fn a_client_that_disconnects_while_queued_leaves_the_queue() {
    let server = Server::with_args(
        |s| echo(s, None),
        &[
            "--max-concurrent-requests",
            "1",
            "--max-queued-requests",
            "1",
        ],
    );
    server.load();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| chat(&server, 2000).status().as_u16());
        eventually("the first request runs", Duration::from_secs(10), || {
            scheduler(&server)["in_flight"] == 1
        });
        let gave_up = reqwest::blocking::Client::new()
            .post(format!("{}/v1/chat/completions", server.url))
            .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}))
            .timeout(Duration::from_millis(300))
            .send();
        assert!(gave_up.is_err(), "the client timed out while queued");
        eventually("the queue's emptying", Duration::from_secs(5), || {
            scheduler(&server)["queued"] == 0
        });
        // Its place is free: the next request waits instead of a 429.
        let next = scope.spawn(|| chat(&server, 5).status().as_u16());
        assert_eq!(first.join().unwrap(), 200);
        assert_eq!(next.join().unwrap(), 200);
    });
}

#[test]
fn an_idle_model_is_unloaded_after_its_ttl() {
    let server = Server::with(|s| {
        beta(s);
        s.settings("[models.tiny]\nttl_seconds = 1\n");
    });
    let pid = pid_of(&server.load());
    // The event is recorded once the engine's process group is gone.
    eventually("the idle unload", Duration::from_secs(8), || {
        !server.event_log("unloaded").is_empty()
    });
    assert!(!alive(pid));
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
    assert_eq!(
        server.event_log("unloaded"),
        ["tiny: unloaded after 1 s idle (ttl_seconds)"]
    );
}

#[test]
fn a_pinned_model_loads_at_start_and_health_is_503_until_it_is_ready() {
    let server = Server::with(|s| {
        slow_alpha(s, 2);
        s.settings("[models.tiny]\npin = true\n");
    });
    let (status, health) = server.get("/health");
    assert_eq!(
        (status, health["status"].clone(), health["pinned"].clone()),
        (503, json!("loading"), json!({"tiny": "loading"})),
        "{health}"
    );
    eventually("the pinned model's load", Duration::from_secs(20), || {
        server.get("/health").0 == 200
    });
    let (_, health) = server.get("/health");
    assert_eq!(
        (health["status"].clone(), health["pinned"].clone()),
        (json!("healthy"), json!({"tiny": "ready"})),
        "{health}"
    );
    assert_eq!(health["sessions"][0]["model"], "tiny");
}

#[test]
fn a_pinned_model_that_cannot_load_keeps_health_at_503_saying_why() {
    let server = Server::with(|s| {
        beta_with(s, "[]");
        s.settings("[models.tiny]\npin = true\n");
    });
    eventually("the pinned load's failure", Duration::from_secs(10), || {
        server.get("/health").1["pinned"]["tiny"]
            .as_str()
            .unwrap()
            .starts_with("failed: ")
    });
    let (status, health) = server.get("/health");
    assert_eq!(status, 503, "{health}");
    assert!(
        health["pinned"]["tiny"]
            .as_str()
            .unwrap()
            .contains("does not declare"),
        "{health}"
    );
}

#[test]
fn at_max_loaded_models_the_least_recently_used_model_is_evicted() {
    let server = Server::with_args(
        |s| {
            beta(s);
            model(s, "other", 0);
        },
        &["--max-loaded-models", "1"],
    );
    let pid = pid_of(&server.load());
    let (status, body) = server.post("/api/models/other/load", json!({}));
    assert_eq!(status, 200, "{body}");
    eventually("the eviction", Duration::from_secs(8), || {
        !server.event_log("unloaded").is_empty()
    });
    assert!(!alive(pid));
    let (_, sessions) = server.get("/api/sessions");
    let models: Vec<&Value> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["model"])
        .collect();
    assert_eq!(models, [&json!("other")]);
    assert_eq!(
        server.event_log("unloaded"),
        ["tiny: evicted (least recently used) to make room for 'other'"]
    );
    // The scheduler's events reach /metrics as every session event does.
    let metrics = reqwest::blocking::get(format!("{}/metrics", server.url))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("hangar_session_events_total{model=\"tiny\",kind=\"unloaded\"} 1"),
        "{metrics}"
    );
}

#[test]
fn an_unload_sent_while_the_model_loads_cancels_the_load() {
    let server = Server::with(|s| slow_alpha(s, 30));
    std::thread::scope(|scope| {
        let load = scope.spawn(|| server.post("/api/models/tiny/load", json!({})));
        eventually("the load's start", Duration::from_secs(10), || {
            server.get("/health").1["loading"] == json!(["tiny"])
        });
        let (status, body) = server.post("/api/models/tiny/unload", json!({}));
        assert_eq!(status, 200, "{body}");
        let (status, body) = load.join().unwrap();
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (503, json!("load_cancelled")),
            "{body}"
        );
    });
    let (_, health) = server.get("/health");
    assert_eq!(
        (health["loading"].clone(), health["sessions"].clone()),
        (json!([]), json!([])),
        "{health}"
    );
    assert_eq!(server.event_log("loaded"), Vec::<String>::new());
}

#[test]
fn a_load_asked_for_right_after_the_engine_died_is_the_schedulers() {
    // The engine takes 2 s to start, so the scheduler's once-a-second look
    // at its models runs while it loads again.
    let server = Server::with(|s| slow_alpha(s, 2));
    let pid = pid_of(&server.load());
    kill9(pid);
    // Asked for as soon as the session is gone, most likely before the
    // scheduler has looked: it still counts the model ready. A load
    // started outside it was counted absent once it looked, and stayed
    // so while its engine ran, outside the memory guard and eviction.
    eventually("the session's removal", Duration::from_secs(10), || {
        server.get("/api/sessions").1["sessions"] == json!([])
    });
    let again = pid_of(&server.load());
    assert_ne!(again, pid);
    let view = scheduler(&server);
    assert_eq!(view["models"][0]["state"], "ready", "{view}");
    assert_eq!(server.events("loaded"), 2);
}

#[test]
fn a_model_that_does_not_fit_the_memory_limit_is_refused_with_503_naming_need_and_free() {
    let server = Server::with_args(
        |s| {
            beta(s);
            model(s, "big", 8192);
        },
        &["--memory-limit", "4K"],
    );
    let (status, body) = server.post(
        "/v1/chat/completions",
        json!({"model": "big", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (503, json!("insufficient_memory")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("model 'big' needs 8.0 KiB but only 4.0 KiB is free under the memory ceiling of 4.0 KiB")
            && message.contains("pinned: none"),
        "{message}"
    );
    // A model that fits loads.
    server.load();
}

#[test]
fn an_unload_waits_for_in_flight_requests_to_finish() {
    let server = Server::with(|s| {
        echo(s, None);
        s.settings("[models.tiny]\ndrain_seconds = 30\n");
    });
    server.load();
    std::thread::scope(|scope| {
        let running = scope.spawn(|| chat(&server, 1500).status().as_u16());
        eventually("the request runs", Duration::from_secs(10), || {
            scheduler(&server)["in_flight"] == 1
        });
        let (status, body) = server.post("/api/models/tiny/unload", json!({}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["outcome"], "draining", "{body}");
        // The request was answered, not cut off, and the engine stopped
        // once it was done (not at the drain's deadline).
        assert_eq!(running.join().unwrap(), 200);
    });
    eventually("the unload", Duration::from_secs(10), || {
        server.event_log("unloaded") == ["tiny: unloaded on request"]
    });
}

/// `POST /api/models/tiny/unload`, timed: every unload must answer within
/// a second, whatever the model is doing.
fn unload(server: &Server) -> (u16, Value) {
    let started = std::time::Instant::now();
    let answer = server.post("/api/models/tiny/unload", json!({}));
    let took = started.elapsed();
    eprintln!("unload answered in {took:?}: {}", answer.1);
    assert!(took < Duration::from_secs(1), "unload answered in {took:?}");
    answer
}

#[test]
fn an_unload_answers_at_once_while_requests_drain_and_the_deadline_ends_them_with_an_error() {
    let server = Server::with(|s| {
        echo(s, None);
        s.settings("[models.tiny]\ndrain_seconds = 2\n");
    });
    server.load();
    std::thread::scope(|scope| {
        // A stream that would run for minutes, read as it comes.
        let running = scope.spawn(|| {
            let response = reqwest::blocking::Client::new()
                .post(format!("{}/v1/chat/completions", server.url))
                .json(&json!({
                    "model": "tiny", "stream": true, "max_tokens": 200000,
                    "messages": [{"role": "user", "content": "on and on"}],
                }))
                .send()
                .unwrap();
            let text = response.text().unwrap_or_default();
            text.lines()
                .rev()
                .find(|l| l.starts_with("data: "))
                .unwrap_or_default()
                .to_string()
        });
        eventually("the stream runs", Duration::from_secs(10), || {
            scheduler(&server)["in_flight"] == 1
        });
        let (status, body) = unload(&server);
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (body["outcome"].clone(), body["message"].clone()),
            (
                json!("draining"),
                json!("draining 1 request, done in ≤ 2 s (drain_seconds); requests still running then are ended with an error")
            ),
            "{body}"
        );
        // Asked again while it drains, it says so again, at once.
        let (status, body) = unload(&server);
        assert_eq!((status, body["outcome"].clone()), (200, json!("draining")));
        let last = running.join().unwrap();
        let last: Value = serde_json::from_str(last.trim_start_matches("data: ")).unwrap();
        assert_eq!(
            last["error"]["message"],
            "model 'tiny' was unloaded on request; requests still running after the drain period were cut off",
            "{last}"
        );
    });
    eventually("the unload", Duration::from_secs(10), || {
        server.events("unloaded") == 1
    });
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
}

#[test]
fn unloads_answer_at_once_during_and_right_after_eight_concurrent_loads() {
    // During: the engine takes 30 s to start; the unload cancels the load
    // that all eight share.
    let server = Server::with(|s| slow_alpha(s, 30));
    std::thread::scope(|scope| {
        let loads: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| server.post("/api/models/tiny/load", json!({}))))
            .collect();
        eventually("the load's start", Duration::from_secs(10), || {
            server.get("/health").1["loading"] == json!(["tiny"])
        });
        let (status, body) = unload(&server);
        assert_eq!(
            (status, body["outcome"].clone(), body["message"].clone()),
            (200, json!("load_cancelled"), json!("cancelled the load")),
            "{body}"
        );
        for load in loads {
            let (status, body) = load.join().unwrap();
            assert_eq!(
                (status, body["error"]["code"].clone()),
                (503, json!("load_cancelled")),
                "{body}"
            );
        }
    });
    drop(server);
    // Right after: eight loads of an engine process, one session, then an
    // unload.
    let server = Server::with(beta);
    let sessions: Vec<Value> = std::thread::scope(|scope| {
        let loads: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| server.post("/api/models/tiny/load", json!({}))))
            .collect();
        loads
            .into_iter()
            .map(|l| {
                let (status, body) = l.join().unwrap();
                assert_eq!(status, 200, "{body}");
                body["session"]["id"].clone()
            })
            .collect()
    });
    assert!(sessions.iter().all(|id| *id == sessions[0]), "{sessions:?}");
    let pid = pid_of(&server.get("/api/sessions").1["sessions"][0]);
    let (status, body) = unload(&server);
    assert_eq!(
        (status, body["outcome"].clone()),
        (200, json!("unloaded")),
        "{body}"
    );
    // The session is gone from the answer on; the engine soon after (the
    // event is recorded once its process group is gone).
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
    // A load sent at once waits for the stop, then starts afresh.
    let again = server.load();
    assert_ne!(again["id"], sessions[0], "{again}");
    assert_eq!(server.event_log("unloaded"), ["tiny: unloaded on request"]);
    assert!(!alive(pid));
    let (status, body) = unload(&server);
    assert_eq!((status, body["outcome"].clone()), (200, json!("unloaded")));
}

#[test]
fn residency_settings_are_checked_by_type_and_range() {
    let server = Server::with(beta);
    let put = |body: Value| {
        let r = reqwest::blocking::Client::new()
            .put(format!("{}/api/models/tiny/settings", server.url))
            .json(&body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let (status, body) = put(json!({"pin": "yes", "ttl_seconds": 0}));
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["error"]["message"],
        "setting 'pin' must be true or false, not \"yes\"; setting 'ttl_seconds' must be between 1 and 31536000, not 0"
    );
    let (status, body) =
        put(json!({"pin": true, "ttl_seconds": 600, "max_concurrent_requests": 2}));
    assert_eq!(status, 200, "{body}");
    // The host's settings never reach the engine.
    assert_eq!(body["effective"], json!({}), "{body}");
}
