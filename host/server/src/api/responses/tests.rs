//! The translation of Responses requests, the events of a streamed
//! response, and follow-ups through the store.

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::super::pieces::{Events as _, Piece};
use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("responses"), 10);
    (dir, store)
}

/// Translates a request and renders the chat request, or the error.
fn check_with(store: &Store, request: Value, expect: Expect) {
    let verdict = match translate(request.to_string().as_bytes(), store) {
        Ok((openai, ask)) => format!(
            "{}\nstream={} store={}",
            Value::Object(openai),
            ask.stream,
            ask.store
        ),
        Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
    };
    expect.assert_eq(&verdict);
}

fn check(request: Value, expect: Expect) {
    let (_dir, store) = store();
    check_with(&store, request, expect);
}

fn delta(text: &str) -> String {
    json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
        .to_string()
}

/// Feeds engine chunks and renders the events, one line each, without
/// the response objects' fields that change per run.
fn check_stream(chunks: &[&str], expect: Expect) {
    let (_dir, store) = store();
    let (_, ask) = translate(br#"{"model": "m", "input": "hi", "stream": true}"#, &store).unwrap();
    let mut events = Streamed::new(ask, Translator::new(vec![]), Arc::new(store));
    let mut out = String::new();
    for chunk in chunks {
        if events.event(format!("data: {chunk}\n\n").as_bytes(), &mut out) {
            break;
        }
    }
    let lines: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with("data: "))
        .map(|l| {
            let mut event: Value = serde_json::from_str(&l[6..]).unwrap();
            if let Some(response) = event.get_mut("response") {
                let keep = ["status", "output", "usage", "incomplete_details", "error"];
                response
                    .as_object_mut()
                    .unwrap()
                    .retain(|k, _| keep.contains(&k.as_str()));
            }
            scrub(&mut event);
            event.to_string()
        })
        .collect();
    expect.assert_eq(&lines.join("\n"));
}

/// Ids made per run become their prefix.
fn scrub(value: &mut Value) {
    match value {
        Value::String(s) => {
            for prefix in ["msg_", "rs_", "fc_", "resp_"] {
                if s.starts_with(prefix) {
                    *s = prefix.to_string();
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(fields) => fields.values_mut().for_each(scrub),
        _ => {}
    }
}

#[test]
fn a_request_becomes_a_streamed_chat_request() {
    check(
        json!({"model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 8,
               "temperature": 0.5, "top_p": 0.9, "stream": true, "store": false,
               "metadata": {"k": "v"}, "user": "u", "truncation": "disabled",
               "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low", "summary": "auto"},
               "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}}}),
        expect![[r#"
            {"max_tokens":8,"messages":[{"content":"Be brief.","role":"system"},{"content":"hi","role":"user"}],"model":"m","reasoning_effort":"low","response_format":{"json_schema":{"name":"x","schema":{"type":"object"},"strict":true},"type":"json_schema"},"stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":0.9}
            stream=true store=false"#]],
    );
}

#[test]
fn items_tools_and_tool_choice_become_chats() {
    check(
        json!({"model": "m",
               "tools": [{"type": "function", "name": "get_weather", "description": "d",
                          "parameters": {"type": "object"}, "strict": false}],
               "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false,
               "input": [
                   {"role": "developer", "content": "Use tools."},
                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather"}, {"type": "input_text", "text": "in Paris?"}]},
                   {"type": "reasoning", "id": "rs_1", "summary": []},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
                   {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                   {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
                   {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Rain"}]}]}),
        expect![[r#"
            {"messages":[{"content":"Use tools.","role":"system"},{"content":"weather\nin Paris?","role":"user"},{"content":"Looking.","role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"call_1","type":"function"},{"function":{"arguments":"{}","name":"get_weather"},"id":"call_2","type":"function"}]},{"content":"Sunny","role":"tool","tool_call_id":"call_1"},{"content":"Rain","role":"tool","tool_call_id":"call_2"}],"model":"m","parallel_tool_calls":false,"stream":true,"stream_options":{"include_usage":true},"tool_choice":{"function":{"name":"get_weather"},"type":"function"},"tools":[{"function":{"description":"d","name":"get_weather","parameters":{"type":"object"},"strict":false},"type":"function"}]}
            stream=false store=true"#]],
    );
}

#[test]
fn every_field_is_checked_by_name() {
    let with = |k: &str, v: Value| {
        let mut r = json!({"model": "m", "input": "hi"});
        r[k] = v;
        r
    };
    let cases = [
        (with("model", json!("")), expect![[r#"400 Some("model"): 'model' is required: a string naming one of the models GET /v1/models lists"#]]),
        (with("input", json!([])), expect![[r#"400 Some("input"): 'input' is required: a string, or a non-empty list of items ({"role": "user", "content": "..."}, function_call_output, ...)"#]]),
        (with("input", json!([{"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]}])),
         expect![[r#"400 Some("input"): 'input[0].content[0].image_url' must be a data: URL such as data:image/png;base64,..., or a file: or http(s) URL where the operator allows them"#]]),
        (with("input", json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])),
         expect![[r#"400 Some("input"): 'input[0].content[0].file_id': this host stores no files; send the image as 'image_url', a data: URL (data:image/png;base64,...)"#]]),
        (with("input", json!([{"role": "user", "content": [{"type": "input_text", "text": "what?"}, {"type": "input_image", "image_url": "data:image/png;base64,iVBORw==", "detail": "low"}]}])),
         expect![[r#"
             {"messages":[{"content":[{"text":"what?","type":"text"},{"image_url":{"detail":"low","url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}
             stream=false store=true"#]]),
        // Found by schemathesis: a type that is not a string was read as none.
        (with("input", json!([{"type": -58800, "role": "user", "content": ""}])),
         expect![[r#"400 Some("input"): 'input[0].type' must be a string such as "message", not -58800"#]]),
        (with("input", json!([{"role": "tool", "content": "x"}])),
         expect![[r#"400 Some("input"): 'input[0].role' must be "user", "assistant", "system" or "developer", not "tool""#]]),
        (with("input", json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
         expect![[r#"400 Some("input"): 'input[0].call_id' must be a string, not null"#]]),
        (with("input", json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "city: Paris"}])),
         expect![[r#"400 Some("input"): 'input[0].arguments' must be a string of JSON, as the answer gave it; it is not JSON (expected value at line 1 column 1)"#]]),
        (with("input", json!([{"type": "item_reference", "id": "x"}])),
         expect!["400 Some(\"input\"): 'input[0]' is a 'item_reference' item; this host serves message, function_call, function_call_output and reasoning items"]),
        (with("tools", json!([{"type": "web_search"}])),
         expect![[r#"400 Some("tools"): 'tools[0]' is a 'web_search' tool, which runs on OpenAI's servers; this host serves function tools ({"type": "function", "name", "parameters"}) only"#]]),
        (with("tool_choice", json!("any")),
         expect![[r#"400 Some("tool_choice"): 'tool_choice' must be "auto", "none", "required" or {"type": "function", "name": "..."}, not "any""#]]),
        (with("max_output_tokens", json!(0)),
         expect![[r#"400 Some("max_output_tokens"): 'max_output_tokens' must be a whole number from 1 to 4294967295, not 0"#]]),
        (with("temperature", json!(3)),
         expect![[r#"400 Some("temperature"): 'temperature' must be a number from 0 to 2, not 3"#]]),
        (with("background", json!(true)),
         expect![[r#"400 Some("background"): 'background' responses are not supported by this host: it answers while the request is open; leave 'background' out or false"#]]),
        (with("store", json!("no")),
         expect![[r#"400 Some("store"): 'store' must be true or false, not "no""#]]),
        (with("text", json!({"format": {"type": "json_schema", "name": "x"}})),
         expect![[r#"400 Some("text"): 'text.format.schema' must be a JSON Schema object, not null"#]]),
        (with("text", json!({"format": {"type": "text", "strict": "yes"}})),
         expect![[r#"400 Some("text"): 'text.format.strict' must be true or false, not "yes""#]]),
        (with("reasoning", json!({"summary": 5})),
         expect![[r#"400 Some("reasoning"): 'reasoning.summary' must be a string such as "auto", not 5"#]]),
        (with("reasoning", json!({"effort": "max"})),
         expect![[r#"400 Some("reasoning"): 'reasoning.effort' must be one of low, medium, high, not "max""#]]),
        (with("metadata", json!({"k": 1})),
         expect![[r#"400 Some("metadata"): 'metadata.k' must be a string, not 1"#]]),
        (with("previous_response_id", json!("resp_gone")),
         expect![[r#"404 Some("previous_response_id"): Response with id 'resp_gone' not found."#]]),
        (with("seed", json!(1)),
         expect!["400 None: 'seed' is not supported by this host (it serves: model, input, instructions, tools, tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p, stream, store, previous_response_id, text, reasoning, metadata, user, truncation, include, background, prompt_cache_key)"]),
    ];
    for (request, expect) in cases {
        check(request, expect);
    }
}

#[test]
fn a_stream_becomes_response_events_in_order() {
    check_stream(
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"hm"},"finish_reason":null}]}"#,
            &delta("Hel"),
            &delta("lo"),
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#,
            "[DONE]",
        ],
        expect![[r#"
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}
            {"item":{"content":[],"id":"rs_","status":"in_progress","summary":[],"type":"reasoning"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}
            {"content_index":0,"item_id":"rs_","output_index":0,"part":{"text":"","type":"reasoning_text"},"sequence_number":3,"type":"response.content_part.added"}
            {"content_index":0,"delta":"hm","item_id":"rs_","output_index":0,"sequence_number":4,"type":"response.reasoning_text.delta"}
            {"content_index":0,"item_id":"rs_","output_index":0,"sequence_number":5,"text":"hm","type":"response.reasoning_text.done"}
            {"content_index":0,"item_id":"rs_","output_index":0,"part":{"text":"hm","type":"reasoning_text"},"sequence_number":6,"type":"response.content_part.done"}
            {"item":{"content":[{"text":"hm","type":"reasoning_text"}],"id":"rs_","status":"completed","summary":[],"type":"reasoning"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}
            {"item":{"content":[],"id":"msg_","role":"assistant","status":"in_progress","type":"message"},"output_index":1,"sequence_number":8,"type":"response.output_item.added"}
            {"content_index":0,"item_id":"msg_","output_index":1,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":9,"type":"response.content_part.added"}
            {"content_index":0,"delta":"Hel","item_id":"msg_","logprobs":[],"output_index":1,"sequence_number":10,"type":"response.output_text.delta"}
            {"content_index":0,"delta":"lo","item_id":"msg_","logprobs":[],"output_index":1,"sequence_number":11,"type":"response.output_text.delta"}
            {"content_index":0,"item_id":"msg_","logprobs":[],"output_index":1,"sequence_number":12,"text":"Hello","type":"response.output_text.done"}
            {"content_index":0,"item_id":"msg_","output_index":1,"part":{"annotations":[],"text":"Hello","type":"output_text"},"sequence_number":13,"type":"response.content_part.done"}
            {"item":{"content":[{"annotations":[],"text":"Hello","type":"output_text"}],"id":"msg_","role":"assistant","status":"completed","type":"message"},"output_index":1,"sequence_number":14,"type":"response.output_item.done"}
            {"response":{"error":null,"incomplete_details":null,"output":[{"content":[{"text":"hm","type":"reasoning_text"}],"id":"rs_","status":"completed","summary":[],"type":"reasoning"},{"content":[{"annotations":[],"text":"Hello","type":"output_text"}],"id":"msg_","role":"assistant","status":"completed","type":"message"}],"status":"completed","usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":8}},"sequence_number":15,"type":"response.completed"}"#]],
    );
}

fn call_delta(call: Value) -> String {
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
        .to_string()
}

#[test]
fn tool_calls_and_cuts_and_failures() {
    check_stream(
        &[
            &call_delta(
                json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":"}}),
            ),
            &call_delta(json!({"index": 0, "function": {"arguments": "1}"}})),
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ],
        expect![[r#"
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}
            {"item":{"arguments":"","call_id":"call_1","id":"fc_","name":"f","status":"in_progress","type":"function_call"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}
            {"delta":"{\"a\":","item_id":"fc_","output_index":0,"sequence_number":3,"type":"response.function_call_arguments.delta"}
            {"delta":"1}","item_id":"fc_","output_index":0,"sequence_number":4,"type":"response.function_call_arguments.delta"}
            {"arguments":"{\"a\":1}","item_id":"fc_","output_index":0,"sequence_number":5,"type":"response.function_call_arguments.done"}
            {"item":{"arguments":"{\"a\":1}","call_id":"call_1","id":"fc_","name":"f","status":"completed","type":"function_call"},"output_index":0,"sequence_number":6,"type":"response.output_item.done"}
            {"response":{"error":null,"incomplete_details":null,"output":[{"arguments":"{\"a\":1}","call_id":"call_1","id":"fc_","name":"f","status":"completed","type":"function_call"}],"status":"completed","usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":0},"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":0}},"sequence_number":7,"type":"response.completed"}"#]],
    );
    check_stream(
        &[
            &delta("a"),
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            "[DONE]",
        ],
        expect![[r#"
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}
            {"item":{"content":[],"id":"msg_","role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}
            {"content_index":0,"item_id":"msg_","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":3,"type":"response.content_part.added"}
            {"content_index":0,"delta":"a","item_id":"msg_","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}
            {"content_index":0,"item_id":"msg_","logprobs":[],"output_index":0,"sequence_number":5,"text":"a","type":"response.output_text.done"}
            {"content_index":0,"item_id":"msg_","output_index":0,"part":{"annotations":[],"text":"a","type":"output_text"},"sequence_number":6,"type":"response.content_part.done"}
            {"item":{"content":[{"annotations":[],"text":"a","type":"output_text"}],"id":"msg_","role":"assistant","status":"incomplete","type":"message"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}
            {"response":{"error":null,"incomplete_details":{"reason":"max_output_tokens"},"output":[{"content":[{"annotations":[],"text":"a","type":"output_text"}],"id":"msg_","role":"assistant","status":"incomplete","type":"message"}],"status":"incomplete","usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1}},"sequence_number":8,"type":"response.incomplete"}"#]],
    );
    check_stream(
        &[
            &delta("a"),
            r#"{"error":{"message":"engine 'e' exited","type":"engine_error"}}"#,
        ],
        expect![[r#"
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}
            {"response":{"error":null,"incomplete_details":null,"output":[],"status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}
            {"item":{"content":[],"id":"msg_","role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}
            {"content_index":0,"item_id":"msg_","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":3,"type":"response.content_part.added"}
            {"content_index":0,"delta":"a","item_id":"msg_","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}
            {"content_index":0,"item_id":"msg_","logprobs":[],"output_index":0,"sequence_number":5,"text":"a","type":"response.output_text.done"}
            {"content_index":0,"item_id":"msg_","output_index":0,"part":{"annotations":[],"text":"a","type":"output_text"},"sequence_number":6,"type":"response.content_part.done"}
            {"item":{"content":[{"annotations":[],"text":"a","type":"output_text"}],"id":"msg_","role":"assistant","status":"incomplete","type":"message"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}
            {"response":{"error":{"code":"server_error","message":"engine 'e' exited"},"incomplete_details":null,"output":[{"content":[{"annotations":[],"text":"a","type":"output_text"}],"id":"msg_","role":"assistant","status":"incomplete","type":"message"}],"status":"failed","usage":null},"sequence_number":8,"type":"response.failed"}"#]],
    );
}

#[test]
fn a_follow_up_carries_the_stored_conversation_but_not_its_instructions() {
    let (_dir, store) = store();
    let first = json!({"model": "m", "input": "Hi, I am Ada.", "instructions": "Be brief."});
    let (_, ask) = translate(first.to_string().as_bytes(), &store).unwrap();
    let mut output = Output::default();
    let mut events = String::new();
    output.pieces(vec![Piece::Text("Hello Ada.".into())], &mut events);
    let mut translator = Translator::new(vec![]);
    let _ = translator.event(b"data: [DONE]\n\n");
    let response = finished(&ask, &translator, &mut output, &mut events);
    keep(&store, &ask, &response);
    let id = response["id"].as_str().unwrap().to_string();
    assert_eq!(store.get(&id).unwrap().response, response);
    check_with(
        &store,
        json!({"model": "m", "input": "Who am I?", "previous_response_id": id, "instructions": "Be kind."}),
        expect![[r#"
            {"messages":[{"content":"Be kind.","role":"system"},{"content":"Hi, I am Ada.","role":"user"},{"content":"Hello Ada.","role":"assistant"},{"content":"Who am I?","role":"user"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}
            stream=false store=true"#]],
    );
    // `store: false` keeps nothing to follow up on.
    let (_, ask) = translate(br#"{"model": "m", "input": "x", "store": false}"#, &store).unwrap();
    let response = finished(&ask, &translator, &mut Output::default(), &mut events);
    keep(&store, &ask, &response);
    assert_eq!(store.get(response["id"].as_str().unwrap()), None);
}
