//! Other names for a model: aliases listed by `/v1/models` and served as
//! the model, and profiles (`MODEL:PROFILE`) whose request settings fill
//! what a request leaves out, on the model's one session; and the
//! refusals when such names or profiles are stored.

use serde_json::{json, Value};

use crate::fixtures::{manifest, Scenario};
use crate::request_gates::ECHO_BODY;
use crate::serve::Server;

/// Serves `tiny` with the beta plugin running [`ECHO_BODY`] (every chat
/// answered with the request the engine saw), the plugin declaring one
/// load-time setting, `kv_cache_type`.
fn server() -> Server {
    Server::with(|s: &Scenario| {
        let probe = s.engine_program("engine", "beta 0.9.0");
        let script = s.root.path().join("echo_body.py");
        std::fs::write(&script, ECHO_BODY).unwrap();
        let extra = format!(
            "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n\
             [[settings]]\nname = \"kv_cache_type\"\ntype = \"enum\"\nvalues = [\"fp16\", \"int8\"]\n",
            probe.display()
        );
        s.plugin(
            "beta",
            &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
            Some("engine_beta"),
        );
        s.config(&format!(
            "[plugins.beta]\nscript = \"{}\"\nallow_programs = [\"python3\"]\n",
            script.display()
        ));
    })
}

/// The request the engine saw for a chat to `model` with `extra` fields,
/// and the model the answer names.
fn seen(server: &Server, model: &str, extra: Value) -> (Value, String) {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (status, answer) = server.post("/v1/chat/completions", body);
    assert_eq!(status, 200, "{answer}");
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    (
        serde_json::from_str(content).unwrap(),
        answer["model"].as_str().unwrap().to_string(),
    )
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

const NAMES: &str = r#"{
    "kv_cache_type": "int8",
    "aliases": ["small"],
    "profiles": {
        "precise": {"temperature": 0.1, "max_tokens": 3, "stop": ["x"]},
        "same": {"kv_cache_type": "int8", "top_p": 0.5}
    }
}"#;

#[test]
fn aliases_and_profiles_are_listed_and_served_on_one_session() {
    let server = server();
    let (status, body) = server.put(
        "/api/models/tiny/settings",
        serde_json::from_str(NAMES).unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["aliases"], json!(["small"]));

    let (_, list) = server.get("/v1/models");
    let listed: Vec<String> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let of = m["alias_of"].as_str().or(m["profile_of"].as_str());
            format!("{} {}", m["id"].as_str().unwrap(), of.unwrap_or("-"))
        })
        .collect();
    assert_eq!(
        listed,
        [
            "tiny -",
            "small tiny",
            "tiny:precise tiny",
            "tiny:same tiny"
        ]
    );

    // An alias is the model, and the answer keeps the client's name.
    let (request, answered) = seen(&server, "small", json!({}));
    assert_eq!(answered, "small");
    assert_eq!(request["temperature"], Value::Null);

    // A profile fills what the request leaves out, and nothing else.
    let (request, answered) = seen(&server, "tiny:precise", json!({}));
    assert_eq!(answered, "tiny:precise");
    assert_eq!(
        (
            &request["temperature"],
            &request["max_tokens"],
            &request["stop"]
        ),
        (&json!(0.1), &json!(3), &json!(["x"]))
    );
    let (request, _) = seen(
        &server,
        "small:precise",
        json!({"temperature": 0.7, "max_completion_tokens": 9}),
    );
    assert_eq!(request["temperature"], json!(0.7));
    assert_eq!(request["max_tokens"], Value::Null, "{request}");
    // A profile's load-time setting equal to the model's is no request field.
    let (request, _) = seen(&server, "tiny:same", json!({}));
    assert_eq!(request["top_p"], json!(0.5));
    assert_eq!(request["kv_cache_type"], Value::Null);

    // All of it on the one engine: no second load.
    let (_, sessions) = server.get("/api/sessions");
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        1,
        "{sessions}"
    );
    assert_eq!(server.events("loaded"), 1);

    // Ollama's routes take the same names, with or without its tag.
    let (status, answer) = server.post(
        "/ollama/api/chat",
        json!({"model": "small:precise:latest", "stream": false,
               "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 200, "{answer}");
    let request: Value =
        serde_json::from_str(answer["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(request["temperature"], json!(0.1), "{request}");
    let (_, tags) = server.get("/ollama/api/tags");
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tiny", "small", "tiny:precise", "tiny:same"]);

    // The model's routes take its alias, and refuse a profile's name.
    let (status, body) = server.get("/api/models/small/settings");
    assert_eq!((status, body["model"].as_str()), (200, Some("tiny")));
    let (status, body) = server.post("/api/models/tiny:precise/unload", json!({}));
    assert_eq!(status, 400, "{body}");
    assert!(
        message(&body).contains("name the model itself, 'tiny'"),
        "{body}"
    );
    let (status, body) = server.post(
        "/v1/chat/completions",
        json!({"model": "tiny:loose", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        message(&body),
        "model 'tiny' has no profile 'loose' (its profiles: precise, same); see GET /v1/models"
    );
}

#[test]
fn bad_names_and_profiles_are_refused_naming_each() {
    let server = server();
    let (status, body) = server.put(
        "/api/models/tiny/settings",
        json!({
            "kv_cache_type": "int8",
            "aliases": ["tiny", "a b"],
            "profiles": {
                "fast": {"kv_cache_type": "fp16", "temperature": 5},
                "kept": {"pin": true, "reasoning_effort": "extreme"},
                "bad name": {}
            }
        }),
    );
    assert_eq!(status, 422, "{body}");
    let problems: Vec<&str> = message(&body).split("; ").collect();
    expect_test::expect![[r#"
        [
            "aliases[0] ('tiny') is the model's own id",
            "aliases[1] ('a b') has whitespace or a control character",
            "profiles.bad name: a profile's name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "profiles.fast: 'temperature' must be a number from 0 to 2, not 5",
            "profiles.fast: 'kv_cache_type' = \"fp16\" is a load-time setting, and the model loads with \"int8\": a profile runs on the model's loaded engine and changes only request fields (max_tokens, temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, seed, stop, reasoning_effort), so set 'kv_cache_type' on the model itself, or serve a copy of the model folder with it",
            "profiles.kept: 'reasoning_effort' must be one of low, medium, high, not \"extreme\"",
            "profiles.kept: 'pin' is the model's own setting, and a profile shares the model's session: set it on the model",
        ]
    "#]]
    .assert_debug_eq(&problems);
    // Nothing was stored.
    let (_, list) = server.get("/v1/models");
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
}
