//! `hangar serve` with real processes: the supervisor starts the example
//! `beta` plugin's engine (Python's http.server standing in for an engine
//! process), and these tests load, unload, crash and orphan it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixtures::{allow_python, manifest, Scenario};

/// A running `hangar serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    scenario: Scenario,
}

impl Server {
    /// The scenario's folder (models, plugins, config).
    pub fn root(&self) -> &std::path::Path {
        self.scenario.root.path()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `beta` plugin (Python's http.server as the engine, probed as
/// version 0.9.0) for `mlx` and `gguf`, allowed to run `programs`, with
/// `more` appended to its manifest (declared settings, say).
pub fn beta_plugin(s: &Scenario, programs: &str, more: &str) {
    let probe = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!(
        "programs = {programs}\n[probe]\nprogram = \"{}\"\n{more}",
        probe.display()
    );
    s.plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        Some("engine_beta"),
    );
}

/// [`beta_plugin`] running `python3`, and a config that allows it.
pub fn beta(s: &Scenario) {
    beta_plugin(s, "[\"python3\"]", "");
    s.config(&allow_python(&["beta"]));
}

impl Server {
    /// Serves one fake `mlx` model `tiny` with the beta plugin, whose
    /// manifest gets `programs` as given.
    pub fn start(programs: &str) -> Server {
        Server::with(|s| {
            beta_plugin(s, programs, "");
            s.config(&allow_python(&["beta"]));
        })
    }

    /// Serves one fake `mlx` model `tiny` with the plugins and config that
    /// `setup` writes.
    pub fn with(setup: impl FnOnce(&Scenario)) -> Server {
        Server::with_args(setup, &[])
    }

    /// [`Server::with`], with more `hangar serve` arguments.
    pub fn with_args(setup: impl FnOnce(&Scenario), args: &[&str]) -> Server {
        let s = Scenario::new();
        setup(&s);
        model(&s, "tiny", 0);
        let mut child = Command::new(env!("CARGO_BIN_EXE_hangar"))
            .args(["serve", "--port", "0"])
            .args(args)
            .arg("--model-dir")
            .arg(s.root.path().join("models"))
            .arg("--plugins-dir")
            .arg(s.plugins_dir())
            .arg("--config")
            .arg(s.root.path().join("config.toml"))
            .arg("--state-dir")
            .arg(s.root.path().join("state"))
            .env("HANGAR_PLATFORM", &s.platform)
            // Its own pull cache, never this machine's.
            .env("HF_HUB_CACHE", s.root.path().join("hf-cache"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("hangar serve printed its address")
                .unwrap();
            if let Some(rest) = line.strip_prefix("hangar: serving ") {
                let addr = rest
                    .split("http://")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap();
                break format!("http://{addr}");
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            url,
            scenario: s,
        }
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = reqwest::blocking::get(format!("{}{path}", self.url)).unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::blocking::Client::new()
            .post(format!("{}{path}", self.url))
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    pub fn put(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::blocking::Client::new()
            .put(format!("{}{path}", self.url))
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    pub fn load(&self) -> Value {
        let (status, body) = self.post("/api/models/tiny/load", json!({}));
        assert_eq!(status, 200, "{body}");
        body["session"].clone()
    }

    pub fn events(&self, kind: &str) -> usize {
        self.event_log(kind).len()
    }

    /// The events of `kind`, oldest first, each as "model: message".
    pub fn event_log(&self, kind: &str) -> Vec<String> {
        let (_, body) = self.get("/api/events");
        body["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| {
                format!(
                    "{}: {}",
                    e["model"].as_str().unwrap(),
                    e["message"].as_str().unwrap()
                )
            })
            .collect()
    }
}

/// Writes a fake `mlx` model `name` into the scenario's model dir, with
/// `padding` more bytes of weights.
pub fn model(s: &Scenario, name: &str, padding: usize) {
    let model = s.root.path().join("models").join(name);
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    let header = format!("{{}}{}", " ".repeat(padding));
    let mut weights = (header.len() as u64).to_le_bytes().to_vec();
    weights.extend_from_slice(header.as_bytes());
    std::fs::write(model.join("model.safetensors"), weights).unwrap();
}

/// Whether `pid` is a live process (a zombie counts as gone but is
/// reported, since nothing may be left unreaped).
pub fn alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => {
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            assert!(!zombie, "process {pid} was left a zombie");
            true
        }
        Err(_) => false,
    }
}

pub fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not happen within {within:?}");
}

pub fn kill9(pid: u64) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

pub fn pid_of(session: &Value) -> u64 {
    session["pid"]
        .as_u64()
        .expect("the session reports its engine pid")
}

#[test]
fn an_engine_is_started_and_unloading_stops_its_whole_tree() {
    let server = Server::start("[\"python3\"]");
    let session = server.load();
    assert_eq!(session["plugin"], "beta");
    let pid = pid_of(&session);
    assert!(alive(pid));
    let (_, sessions) = server.get("/api/sessions");
    assert_eq!(sessions["sessions"][0]["id"], session["id"]);
    let (status, logs) = server.get(&format!(
        "/api/sessions/{}/logs",
        session["id"].as_str().unwrap()
    ));
    assert_eq!(status, 200, "{logs}");
    let (status, _) = server.post("/api/models/tiny/unload", json!({}));
    assert_eq!(status, 200);
    // The unload answers at once; the event follows once the engine's
    // process group is gone (and reaped).
    eventually("the engine's exit", Duration::from_secs(6), || {
        server.events("unloaded") == 1
    });
    assert!(!alive(pid));
    let (_, sessions) = server.get("/api/sessions");
    assert_eq!(sessions["sessions"], json!([]));
    let (status, body) = server.post("/api/models/tiny/unload", json!({}));
    assert_eq!(status, 404, "{body}");
}

#[test]
fn concurrent_loads_of_one_model_share_one_load() {
    let server = Server::start("[\"python3\"]");
    let ids: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| server.load()["id"].clone()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    assert_eq!(server.events("loaded"), 1);
}

#[test]
fn a_crashed_engine_is_removed_and_loads_again() {
    let server = Server::start("[\"python3\"]");
    let pid = pid_of(&server.load());
    kill9(pid);
    eventually("the session's removal", Duration::from_secs(10), || {
        server.get("/api/sessions").1["sessions"] == json!([])
    });
    assert_eq!(server.events("crashed"), 1);
    assert!(!alive(pid));
    let (_, health) = server.get("/health");
    assert_eq!(health["status"], "healthy");
    let again = pid_of(&server.load());
    assert_ne!(again, pid);
    assert!(alive(again));
}

#[test]
fn no_engine_outlives_a_killed_host() {
    let mut server = Server::start("[\"python3\"]");
    let pid = pid_of(&server.load());
    server.child.kill().unwrap(); // SIGKILL: the host gets no chance to clean up
    server.child.wait().unwrap();
    eventually(
        "the orphaned engine's exit",
        Duration::from_secs(10),
        || !Path::new(&format!("/proc/{pid}")).exists(),
    );
}

#[test]
fn a_launch_plan_naming_an_undeclared_program_is_refused() {
    let server = Server::start("[]");
    let (status, body) = server.post("/api/models/tiny/load", json!({}));
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("names program 'python3', which plugin.toml does not declare"),
        "{message}"
    );
    assert_eq!(server.events("load_failed"), 1);
}

#[test]
fn bad_requests_get_openai_shaped_errors() {
    let server = Server::start("[\"python3\"]");
    let (status, body) = server.post("/v1/chat/completions", json!({"messages": []}));
    assert_eq!(
        (status, body["error"]["param"].clone()),
        (400, json!("model")),
        "{body}"
    );
    let (status, body) = server.post("/v1/chat/completions", json!({"model": "nope"}));
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("available: tiny"),
        "{body}"
    );
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/v1/completions", server.url))
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (status, models) = server.get("/v1/models");
    assert_eq!(
        (status, models["data"][0]["id"].clone()),
        (200, json!("tiny"))
    );
}

/// The body the guide (sdk/README.md) shows for `PUT
/// /api/models/{id}/settings`, and the keys of the answer it shows, are the
/// server's.
#[test]
fn the_guides_model_settings_body_is_what_the_server_takes() {
    let guide = include_str!("../../../../sdk/README.md");
    let section = &guide[guide
        .find("PUT /api/models/{id}/settings")
        .expect("the guide shows the settings route")..];
    let mut blocks = section.split("```json\n").skip(1).map(|block| {
        let json = block.split("```").next().unwrap();
        serde_json::from_str::<Value>(json).expect("the guide's JSON parses")
    });
    let (body, answer) = (blocks.next().unwrap(), blocks.next().unwrap());

    let server = Server::with(|s| {
        let probe = s.engine_program("alpha-engine", "alpha 1.1.0");
        let settings: String = body
            .as_object()
            .unwrap()
            .keys()
            .map(|name| format!("[[settings]]\nname = \"{name}\"\ntype = \"integer\"\nmin = 1\n"))
            .collect();
        let extra = format!(
            "[aliases]\nsafetensors = \"mlx\"\n[probe]\nprogram = \"{}\"\n[capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n{settings}",
            probe.display()
        );
        s.plugin(
            "alpha",
            &manifest("alpha", "engine_alpha", &["mlx"], 10, &extra),
            Some("engine_alpha"),
        );
        s.config("");
    });
    let client = reqwest::blocking::Client::new();
    let put = |body: &Value| {
        let r = client
            .put(format!("{}/api/models/tiny/settings", server.url))
            .json(body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let (status, got) = put(&body);
    assert_eq!(status, 200, "{got}");
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&got), keys(&answer), "{got}");
    assert_eq!(got["stored"], body, "{got}");
    assert_eq!(got["effective"], answer["effective"], "{got}");

    // A value of the wrong type is refused with a 422 that names it.
    let (status, got) = put(&json!({"context_length": "big"}));
    assert_eq!(status, 422, "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context_length"),
        "{got}"
    );
}
