//! `POST /v1/messages` through the whole host, on the in-process `echo`
//! engine (it repeats the prompt's words, so every answer is known): the
//! whole message, the stream's events in Anthropic's order, stop sequences
//! cut by the host, usage, `x-api-key`, and errors in Anthropic's shape.

use std::io::Read;

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use crate::inprocess::echo;
use crate::serve::Server;

fn request(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 5,
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "one two three"}]}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Posts a request and renders the answer: status, then the body (for a
/// stream, each event's name and data on a line), with ids blanked.
fn check(server: &Server, extra: Value, headers: &[(&str, &str)], expect: Expect) {
    let mut call = reqwest::blocking::Client::new()
        .post(format!("{}/v1/messages", server.url))
        .json(&request(extra));
    for (k, v) in headers {
        call = call.header(*k, *v);
    }
    let mut response = call.send().unwrap();
    let mut text = String::new();
    response.read_to_string(&mut text).unwrap();
    let blank = |mut v: Value| {
        if v.get("id").is_some() {
            v["id"] = json!("msg_*");
        }
        if v.pointer("/message/id").is_some() {
            v["message"]["id"] = json!("msg_*");
        }
        v
    };
    let body = match serde_json::from_str::<Value>(&text) {
        Ok(v) => blank(v).to_string(),
        Err(_) => text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let name = e
                    .lines()
                    .find_map(|l| l.strip_prefix("event: "))
                    .unwrap_or("?");
                let data = e
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap_or("");
                format!("{name} {}", blank(serde_json::from_str(data).unwrap()))
            })
            .collect::<Vec<_>>()
            .join("\n"),
    };
    expect.assert_eq(&format!("{} {body}", response.status().as_u16()));
}

#[test]
fn messages_whole_streamed_and_cut_by_a_stop_sequence() {
    let server = Server::with(|s| echo(s, Some("none")));
    check(
        &server,
        json!({}),
        &[],
        expect![[
            r#"200 {"content":[{"text":"one two three one two ","type":"text"}],"id":"msg_*","model":"tiny","role":"assistant","stop_reason":"max_tokens","stop_sequence":null,"type":"message","usage":{"input_tokens":3,"output_tokens":5}}"#
        ]],
    );
    check(
        &server,
        json!({"stream": true, "max_tokens": 3}),
        &[],
        expect![[r#"
            200 message_start {"message":{"content":[],"id":"msg_*","model":"tiny","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
            content_block_start {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
            content_block_delta {"delta":{"text":"one ","type":"text_delta"},"index":0,"type":"content_block_delta"}
            content_block_delta {"delta":{"text":"two ","type":"text_delta"},"index":0,"type":"content_block_delta"}
            content_block_delta {"delta":{"text":"three ","type":"text_delta"},"index":0,"type":"content_block_delta"}
            content_block_stop {"index":0,"type":"content_block_stop"}
            message_delta {"delta":{"stop_reason":"max_tokens","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":3,"output_tokens":3}}
            message_stop {"type":"message_stop"}"#]],
    );
    // "thr" is cut from "three": the text before it, and no more tokens.
    check(
        &server,
        json!({"stop_sequences": ["zzz", "thr"], "max_tokens": 100}),
        &[],
        expect![[
            r#"200 {"content":[{"text":"one two ","type":"text"}],"id":"msg_*","model":"tiny","role":"assistant","stop_reason":"stop_sequence","stop_sequence":"thr","type":"message","usage":{"input_tokens":0,"output_tokens":3}}"#
        ]],
    );
}

#[test]
fn messages_errors_are_in_anthropics_shape_and_x_api_key_is_a_key() {
    let server = Server::with_args(|s| echo(s, Some("none")), &["--api-key", "k"]);
    check(
        &server,
        json!({}),
        &[],
        expect![[
            r#"401 {"error":{"message":"missing or wrong API key; send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with the key hangar serve was started with","type":"authentication_error"},"type":"error"}"#
        ]],
    );
    let key = [("x-api-key", "k"), ("anthropic-version", "2023-06-01")];
    check(
        &server,
        json!({"max_tokens": 1}),
        &key,
        expect![[
            r#"200 {"content":[{"text":"one ","type":"text"}],"id":"msg_*","model":"tiny","role":"assistant","stop_reason":"max_tokens","stop_sequence":null,"type":"message","usage":{"input_tokens":3,"output_tokens":1}}"#
        ]],
    );
    check(
        &server,
        json!({"max_tokens": null}),
        &[("authorization", "Bearer k")],
        expect![[
            r#"400 {"error":{"message":"'max_tokens' is required: the most tokens to generate, a whole number from 1","type":"invalid_request_error"},"type":"error"}"#
        ]],
    );
    check(
        &server,
        json!({"model": "nope"}),
        &key,
        expect![[
            r#"404 {"error":{"message":"model 'nope' does not exist (available: tiny); see GET /v1/models","type":"not_found_error"},"type":"error"}"#
        ]],
    );
}
