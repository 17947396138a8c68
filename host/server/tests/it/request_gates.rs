//! What the host adds to or refuses in a chat request for the engine that
//! serves it: the app default `reasoning_effort`, put into requests for
//! engines with the `reasoning_effort` capability (and noted where it is
//! not), audio parts refused (422, naming `audio_input`) for engines
//! without audio input, and images refused for text-only models (400) and
//! for engines without `vision` (422).

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use crate::fixtures::{manifest, Scenario};
use crate::serve::Server;

/// An engine that answers every chat with the request it got, as JSON text
/// in the message (readiness on `/health`, as `engine_beta`'s script mode
/// wants).
pub const ECHO_BODY: &str = r#"
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer({"status": "ok"})
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.answer({"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": json.dumps(request, sort_keys=True)}}]})
HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"#;

/// Serves `tiny` with the gamma plugin (engine 0.9.0) running
/// [`ECHO_BODY`], its capabilities on from the versions `requirements`
/// give (`reasoning_effort`, `audio_input`); or with the beta plugin, which
/// declares neither, when `requirements` is `None`.
fn server(requirements: Option<(&str, &str)>) -> Server {
    server_with(requirements, ">=0.5")
}

/// [`server`] with gamma's `vision` on from version `vision`, and beside
/// `tiny` a vision-language model `vlm` (a config with a vision tower);
/// images are read from the folder `pictures`, which holds `cat.png`.
fn server_with(requirements: Option<(&str, &str)>, vision: &str) -> Server {
    Server::with(|s: &Scenario| {
        let (id, capabilities) = match requirements {
            Some((effort, audio)) => (
                "gamma",
                format!("reasoning_effort = \"{effort}\"\naudio_input = \"{audio}\"\nvision = \"{vision}\"\n"),
            ),
            None => ("beta", String::new()),
        };
        crate::serve::model(s, "vlm", 0);
        let config = r#"{"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}}"#;
        std::fs::write(s.root.path().join("models/vlm/config.json"), config).unwrap();
        let probe = s.engine_program("engine", &format!("{id} 0.9.0"));
        let script = s.root.path().join("echo_body.py");
        std::fs::write(&script, ECHO_BODY).unwrap();
        let extra = format!(
            "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n[capabilities]\n{capabilities}\n",
            probe.display()
        );
        let library = format!("engine_{id}");
        let formats: &[&str] = if id == "beta" {
            &["mlx", "gguf"]
        } else {
            &["mlx"]
        };
        s.plugin(
            id,
            &manifest(id, &library, formats, 10, &extra),
            Some(&library),
        );
        let pictures = s.root.path().join("pictures");
        std::fs::create_dir_all(&pictures).unwrap();
        std::fs::write(pictures.join("cat.png"), b"\x89PNG\r\n\x1a\n").unwrap();
        s.config(&format!(
            "[images]\nlocal_dirs = [\"{}\"]\n[plugins.{id}]\nscript = \"{}\"\nallow_programs = [\"python3\"]\n",
            pictures.display(),
            script.display()
        ));
    })
}

fn put(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .put(format!("{}{path}", server.url))
        .json(&body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

/// The status and the error message (or the request the engine saw) of a
/// chat with `extra` fields.
fn check_chat(server: &Server, content: Value, extra: Value, expect: Expect) {
    check_chat_on(server, "tiny", content, extra, expect);
}

/// [`check_chat`] for `model`.
fn check_chat_on(server: &Server, model: &str, content: Value, extra: Value, expect: Expect) {
    let mut body = json!({"model": model, "max_tokens": 2,
        "messages": [{"role": "user", "content": content}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (status, answer) = server.post("/v1/chat/completions", body);
    let shown = match answer["choices"][0]["message"]["content"].as_str() {
        Some(seen) => {
            let seen: Value = serde_json::from_str(seen).unwrap();
            let parts: Vec<&str> = seen["messages"][0]["content"]
                .as_array()
                .map(|parts| parts.iter().filter_map(|p| p["type"].as_str()).collect())
                .unwrap_or_default();
            format!(
                "engine saw reasoning_effort: {}, parts: [{}]",
                seen["reasoning_effort"],
                parts.join(", ")
            )
        }
        None => answer["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    };
    expect.assert_eq(&format!("{status} {shown}"));
}

#[test]
fn the_default_reasoning_effort_reaches_engines_that_take_one() {
    let server = server(Some((">=0.5", ">=0.5")));
    let (status, body) = put(
        &server,
        "/api/settings",
        json!({"defaults": {"reasoning_effort": "extreme"}}),
    );
    assert_eq!(status, 422, "{body}");
    expect!["setting 'reasoning_effort' must be one of low, medium, high, not 'extreme'"]
        .assert_eq(body["error"]["message"].as_str().unwrap());
    let (status, body) = put(
        &server,
        "/api/settings",
        json!({"defaults": {"reasoning_effort": "high"}}),
    );
    assert_eq!(status, 200, "{body}");
    check_chat(
        &server,
        json!("hi"),
        json!({}),
        expect![[r#"200 engine saw reasoning_effort: "high", parts: []"#]],
    );
    // The request's own field wins over the default.
    check_chat(
        &server,
        json!("hi"),
        json!({"reasoning_effort": "low"}),
        expect![[r#"200 engine saw reasoning_effort: "low", parts: []"#]],
    );
    assert_eq!(
        server.get("/api/models/tiny/settings").1["notes"],
        json!([])
    );
}

#[test]
fn the_default_reasoning_effort_is_gated_where_the_engine_lacks_it() {
    let server = server(Some((">=2.0", ">=0.5")));
    put(
        &server,
        "/api/settings",
        json!({"defaults": {"reasoning_effort": "medium"}}),
    );
    check_chat(
        &server,
        json!("hi"),
        json!({}),
        expect!["200 engine saw reasoning_effort: null, parts: []"],
    );
    let notes = server.get("/api/models/tiny/settings").1["notes"].clone();
    expect![[r#"
        [
          "app default 'reasoning_effort' is not passed to this model's requests: plugin 'gamma' needs engine >=2.0 for reasoning_effort; found 0.9.0"
        ]"#]].assert_eq(&serde_json::to_string_pretty(&notes).unwrap());
}

#[test]
fn audio_parts_need_the_audio_input_capability() {
    let audio = json!([
        {"type": "text", "text": "what is said?"},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    ]);
    // Not declared at all, then declared from a later engine version.
    let host = server(None);
    check_chat(&host, audio.clone(), json!({}), expect!["422 messages[0].content[1] is an input_audio part, which needs the audio_input capability: plugin 'beta' does not declare the audio_input capability; send text only, or serve the model with an engine that takes audio"]);
    drop(host);
    let host = server(Some((">=0.5", ">=1.0")));
    check_chat(&host, audio.clone(), json!({}), expect!["422 messages[0].content[1] is an input_audio part, which needs the audio_input capability: plugin 'gamma' needs engine >=1.0 for audio_input; found 0.9.0; send text only, or serve the model with an engine that takes audio"]);
    // Nothing was loaded for them: they were refused at the edge.
    assert_eq!(host.events("loaded"), 0);
    drop(host);
    let host = server(Some((">=0.5", ">=0.9")));
    check_chat(
        &host,
        audio,
        json!({}),
        expect!["200 engine saw reasoning_effort: null, parts: [text, input_audio]"],
    );
}

#[test]
fn images_need_a_vision_model_and_an_engine_with_vision() {
    let image = json!([
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
    ]);
    let host = server_with(Some((">=0.5", ">=0.5")), ">=1.0");
    // A text-only model: refused for the model, whatever its engine.
    check_chat(&host, image.clone(), json!({}), expect!["400 messages[0].content[1] is an image, and model 'tiny' takes text only: it has no vision tower (no vision_config in its config.json), so it lacks the vision capability an image needs; send text only, or ask a vision-language model"]);
    // A vision model on an engine version without vision.
    check_chat_on(&host, "vlm", image.clone(), json!({}), expect!["422 messages[0].content[1] is an image_url part, which needs the vision capability: plugin 'gamma' needs engine >=1.0 for vision; found 0.9.0; send text only, or serve the model with an engine that takes images"]);
    assert_eq!(host.events("loaded"), 0);
    // The catalog says which model takes images.
    let models = host.get("/api/models").1;
    let vlm = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"]["id"] == "vlm")
        .unwrap();
    assert_eq!(vlm["model"]["vision"], true, "{vlm}");
    assert_eq!(vlm["model"]["model_type"], "qwen2_5_vl", "{vlm}");
    drop(host);
    let host = server_with(Some((">=0.5", ">=0.5")), ">=0.9");
    check_chat_on(
        &host,
        "vlm",
        image,
        json!({}),
        expect!["200 engine saw reasoning_effort: null, parts: [text, image_url]"],
    );
    // An image named by a file of the folders `[images]` lists reaches the
    // engine as its bytes; a file elsewhere is refused, naming the part.
    let url = |path: &std::path::Path| format!("file://{}", path.display());
    let root = std::fs::canonicalize(host.root()).unwrap();
    let by_file = |path: &std::path::Path| {
        let body = json!({"model": "vlm", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url(path)}},
        ]}]});
        host.post("/v1/chat/completions", body)
    };
    let (status, answer) = by_file(&root.join("pictures/cat.png"));
    assert_eq!(status, 200, "{answer}");
    let seen: Value =
        serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen["messages"][0]["content"][1]["image_url"]["url"], "data:image/png;base64,iVBORw0KGgo=",
        "{seen}"
    );
    let (status, answer) = by_file(&root.join("config.toml"));
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("'messages[0].content[1].image_url.url' (file://")
            && message.contains("names a file outside the folders this host reads images from"),
        "{message}"
    );
    // Anthropic's and the Responses API's refusals name the part as the
    // client sent it, counting the images before it.
    let outside = url(&root.join("config.toml"));
    let inside = url(&root.join("pictures/cat.png"));
    let (status, answer) = host.post(
        "/v1/messages",
        json!({"model": "vlm", "max_tokens": 2, "system": "be brief", "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": inside}}]},
            {"role": "assistant", "content": "a cat"},
            {"role": "user", "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image", "source": {"type": "url", "url": outside}},
            ]},
        ]}),
    );
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("'messages[2].content[1].source.url' (file://")
            && message.contains("names a file outside"),
        "{message}"
    );
    let (status, answer) = host.post(
        "/v1/responses",
        json!({"model": "vlm", "max_output_tokens": 2, "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": inside}]},
            {"role": "user", "content": [
                {"type": "input_text", "text": "and this?"},
                {"type": "input_image", "image_url": outside},
            ]},
        ]}),
    );
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "input", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("'input[1].content[1].image_url' (file://")
            && message.contains("names a file outside"),
        "{message}"
    );
}
