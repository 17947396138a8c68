//! Tool calls through `hangar serve`: the `echo` example answers with its
//! prompt, so a prompt holding a Hermes `<tool_call>` is an answer that
//! calls a tool, which the host must parse into the same call on both
//! routes, whole and streamed; and what the engine cannot honour is a 400
//! naming the capability.

use std::io::{BufRead, BufReader};

use serde_json::{json, Value};

use crate::inprocess::echo;
use crate::serve::{model, Server};

const CALL: &str =
    "Checking. <tool_call> {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} </tool_call> <|eos|>";

/// A model `agent` whose chat template renders tools in Hermes markup, and
/// `plain`, whose template renders none.
fn agents(s: &crate::fixtures::Scenario) {
    echo(s, None);
    for (name, template) in [
        (
            "agent",
            "{% if tools %}<tool_call>{% endif %}{{ messages }}",
        ),
        ("plain", "{{ messages }}"),
    ] {
        model(s, name, 0);
        let config = json!({ "chat_template": template }).to_string();
        let path = s.root.path().join("models").join(name);
        std::fs::write(path.join("tokenizer_config.json"), config).unwrap();
    }
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

/// The data lines of a streamed answer.
fn events(server: &Server, path: &str, body: Value) -> Vec<Value> {
    let response = reqwest::blocking::Client::new()
        .post(format!("{}{path}", server.url))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    BufReader::new(response)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .filter_map(|d| serde_json::from_str(&d).ok())
        .collect()
}

#[test]
fn a_tool_call_is_parsed_alike_whole_and_streamed_on_both_routes() {
    let server = Server::with(agents);
    let (_, models) = server.get("/api/models");
    let chat: Vec<Value> = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            json!([
                m["model"]["id"],
                m["chat"]["takes_tools"],
                m["chat"]["tool_parser"]
            ])
        })
        .collect();
    assert_eq!(
        json!(chat),
        json!([
            ["agent", true, "hermes"],
            ["plain", false, null],
            ["tiny", null, null]
        ])
    );

    let request = json!({"model": "agent", "max_tokens": 64, "tools": tools(),
                         "messages": [{"role": "user", "content": CALL}]});
    let (status, body) = server.post("/v1/chat/completions", request.clone());
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Checking. ");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let chunks = events(&server, "/v1/chat/completions", streamed);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{calls:?}");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    let assembled: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&assembled).unwrap(),
        arguments
    );
    let finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    let anthropic = json!({"model": "agent", "max_tokens": 64,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": CALL}]});
    let (status, body) = server.post("/v1/messages", anthropic.clone());
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["content"][1]["type"], "tool_use");
    assert_eq!(body["content"][1]["input"], json!({"city": "Paris"}));
    let mut streamed = anthropic;
    streamed["stream"] = json!(true);
    let partial: String = events(&server, "/v1/messages", streamed)
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), arguments);
}

#[test]
fn what_the_engine_or_template_cannot_honour_is_a_400_naming_it() {
    let server = Server::with(agents);
    let refused = |body: Value| {
        let (status, body) = server.post("/v1/chat/completions", body);
        assert_eq!(status, 400, "{body}");
        (
            body["error"]["param"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            body["error"]["message"].as_str().unwrap().to_string(),
        )
    };
    let ask = |model: &str, extra: Value| {
        let mut body = json!({"model": model, "max_tokens": 4, "tools": tools(),
                              "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let (param, message) = refused(ask("agent", json!({"tool_choice": "required"})));
    assert_eq!(param, "tool_choice");
    assert!(
        message.contains("'structured_output'") && message.contains("engine 'echo'"),
        "{message}"
    );
    let (param, message) = refused(ask(
        "agent",
        json!({"response_format": {"type": "json_object"}}),
    ));
    assert_eq!(param, "response_format");
    assert!(message.contains("'structured_output'"), "{message}");
    let (param, message) = refused(ask("plain", json!({})));
    assert_eq!(param, "tools");
    assert!(message.contains("chat template"), "{message}");
    // With "none" the tools are not shown, and the markup stays text.
    let mut body = ask("agent", json!({"tool_choice": "none", "max_tokens": 64}));
    body["messages"][0]["content"] = json!(CALL);
    let (status, body) = server.post("/v1/chat/completions", body);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["choices"][0]["message"]["tool_calls"].is_null());
}
