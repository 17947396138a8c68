//! `POST /v1/messages`: Anthropic's Messages API, translated by the host to
//! the OpenAI chat request every engine already serves.
//!
//! A request is validated here field by field (Anthropic's rules: a
//! required `max_tokens`, `temperature` in 0..=1; text, `tool_use` and
//! `tool_result` blocks), turned into an OpenAI chat request (`tools` as
//! function tools, `tool_choice` `auto`/`any`/`tool`/`none` as
//! `auto`/`required`/a named function/`none`, `tool_result` blocks as
//! `tool` messages, `tool_use` blocks as the assistant's `tool_calls`), and
//! sent through [`super::openai::proxy`],
//! the one path every engine request takes (validation, gating, scheduler
//! admission, health waits, metrics, and the host's parsing of tool calls
//! and reasoning). The engine is always asked for a stream with usage; its
//! chunks become Anthropic's events (`message_start`,
//! `content_block_start`, `content_block_delta`, `content_block_stop`,
//! `message_delta`, `message_stop`), reasoning as `thinking` blocks and
//! tool calls as `tool_use` blocks streamed as `input_json_delta`
//! (`stop_reason: "tool_use"`), or, for a request without `stream`, are
//! gathered into one message.
//!
//! `stop_sequences` are matched by the host, not the engine: OpenAI engines
//! strip a matched stop string and report only `stop`, which cannot tell a
//! stop sequence from the end of the turn. The host holds back text that
//! could begin a stop sequence, and on a match ends the message with
//! `stop_reason: "stop_sequence"` and hangs up on the engine, which stops
//! generating. The engine's usage never arrives then: `output_tokens`
//! counts the engine's text events up to the match (one per token for the
//! engines here), as the metrics do for streams without usage, and
//! `input_tokens` is the engine's count when it sent one, else 0.
//!
//! Every error is in Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`, with the status the
//! OpenAI routes would give.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::images::ImageNames;
use super::pieces::{self, Piece, Step, Translator};
use super::{validate, ApiError, App};

/// The route, as the metrics label it.
const ROUTE: &str = "/v1/messages";

/// The fields of a request this host serves; any other is refused by name.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "tools",
    "tool_choice",
];

/// `POST /v1/messages`.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic",
    request_body(content = super::schema::MessagesRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The message, whole or streamed", content((super::schema::Message = "application/json"), (super::schema::SseEvent = "text/event-stream"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::AnthropicError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::AnthropicError)
    ))]
pub(super) async fn messages(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let translated = body.map_err(ApiError::from).and_then(|b| translate(&b));
    pieces::through_proxy(app, ROUTE, translated, answer_with, error_response).await
}

/// What the translation keeps for the answer.
#[derive(Debug)]
pub(super) struct Ask {
    /// The client's model id.
    model: String,
    stream: bool,
    stops: Vec<String>,
    /// Where the request's images are, as the client named them.
    images: ImageNames,
}

impl super::pieces::NamesImages for Ask {
    fn image_names(&self) -> ImageNames {
        self.images.clone()
    }
}

/// Validates an Anthropic request and translates it to an OpenAI chat
/// request (always streamed, with usage).
pub(super) fn translate(body: &[u8]) -> Result<(Map<String, Value>, Ask), ApiError> {
    let request = validate::object_of(body, FIELDS)?;
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "'model' is required: a string naming one of the models GET /v1/models lists",
                Some("model"),
            ))
        }
    };
    let max_tokens =
        validate::count(request.get("max_tokens"), "max_tokens")?.ok_or_else(|| {
            ApiError::bad_request(
                "'max_tokens' is required: the most tokens to generate, a whole number from 1",
                Some("max_tokens"),
            )
        })?;
    let stream = match request.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("'stream' must be true or false, not {other}"),
                Some("stream"),
            ))
        }
    };
    let stops = stop_sequences(request.get("stop_sequences"))?;
    let mut chat = Vec::new();
    if let Some(system) = request.get("system").filter(|v| !v.is_null()) {
        chat.push(json!({ "role": "system", "content": text_of(system, "system")? }));
    }
    let turns = match request.get("messages") {
        Some(Value::Array(turns)) if !turns.is_empty() => turns,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "'messages' is required: a non-empty list of {\"role\", \"content\"} turns",
                Some("messages"),
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("'messages' must be a list of turns, not {other}"),
                Some("messages"),
            ))
        }
    };
    for (i, turn) in turns.iter().enumerate() {
        let bad = |what: String| ApiError::bad_request(what, Some("messages"));
        let Value::Object(turn) = turn else {
            return Err(bad(format!(
                "'messages[{i}]' must be an object with 'role' and 'content', not {turn}"
            )));
        };
        let role = match turn.get("role") {
            Some(Value::String(r)) if r == "user" || r == "assistant" => r,
            None => return Err(bad(format!("'messages[{i}].role' is missing"))),
            Some(other) => {
                return Err(bad(format!(
                    "'messages[{i}].role' must be \"user\" or \"assistant\" (the system prompt is the top-level 'system'), not {other}"
                )))
            }
        };
        match turn.get("content") {
            Some(Value::Array(blocks)) if !blocks.is_empty() => {
                turn_blocks(i, role, blocks, &mut chat)?
            }
            Some(content) => {
                let content = text_of(content, &format!("messages[{i}].content"))?;
                chat.push(json!({ "role": role, "content": content }));
            }
            None => return Err(bad(format!("'messages[{i}].content' is missing"))),
        }
    }
    if let Some(metadata) = request.get("metadata").filter(|v| !v.is_null()) {
        match metadata.get("user_id") {
            _ if !metadata.is_object() => {
                return Err(ApiError::bad_request(
                    format!(
                    "'metadata' must be an object such as {{\"user_id\": \"...\"}}, not {metadata}"
                ),
                    Some("metadata"),
                ))
            }
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!("'metadata.user_id' must be a string, not {other}"),
                    Some("metadata"),
                ))
            }
        }
    }
    let mut openai = Map::new();
    openai.insert("model".into(), json!(model));
    openai.insert("messages".into(), Value::Array(chat));
    openai.insert("max_tokens".into(), json!(max_tokens));
    // Anthropic's temperature runs from 0 to 1 (OpenAI's to 2): same scale,
    // narrower range, so a value passes unchanged.
    if let Some(t) = validate::within(request.get("temperature"), "temperature", 0.0, 1.0)? {
        openai.insert("temperature".into(), json!(t));
    }
    if let Some(p) = validate::number(request.get("top_p"), "top_p")? {
        openai.insert("top_p".into(), json!(p));
    }
    if let Some(k) = validate::count(request.get("top_k"), "top_k")? {
        openai.insert("top_k".into(), json!(k));
    }
    if let Some(tools) = tools(request.get("tools"))? {
        openai.insert("tools".into(), tools);
    }
    openai.extend(tool_choice(request.get("tool_choice"))?);
    openai.insert("stream".into(), json!(true));
    openai.insert("stream_options".into(), json!({ "include_usage": true }));
    // A user turn's `image` blocks become the chat's image parts, in order.
    let mut images = ImageNames {
        param: Some("messages"),
        paths: Vec::new(),
    };
    if let Some(Value::Array(turns)) = request.get("messages") {
        for (i, turn) in turns.iter().enumerate() {
            let Some(Value::Array(blocks)) = turn.get("content") else {
                continue;
            };
            if turn.get("role").and_then(Value::as_str) != Some("user") {
                continue;
            }
            for (j, block) in blocks.iter().enumerate() {
                if block.get("type").and_then(Value::as_str) == Some("image") {
                    images
                        .paths
                        .push(format!("messages[{i}].content[{j}].source.url"));
                }
            }
        }
    }
    Ok((
        openai,
        Ask {
            model,
            stream,
            stops,
            images,
        },
    ))
}

/// Anthropic's `tools` (`{name, description, input_schema}`) as OpenAI's
/// function tools; `None` when absent.
fn tools(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("tools")));
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return bad(format!(
                "'tools' must be a list of {{\"name\", \"input_schema\"}} tools, not {other}"
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let Value::Object(tool) = tool else {
            return bad(format!(
                "'tools[{i}]' must be an object with 'name' and 'input_schema', not {tool}"
            ));
        };
        match tool.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(kind)) if kind == "custom" => {}
            Some(Value::String(kind)) => {
                return bad(format!(
                    "'tools[{i}]' is a '{kind}' tool, which runs on Anthropic's servers; this host serves client tools ({{\"name\", \"input_schema\"}}) only"
                ))
            }
            Some(other) => {
                return bad(format!(
                    "'tools[{i}].type' must be \"custom\" or absent, not {other}"
                ))
            }
        }
        let name = match tool.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n,
            other => {
                return bad(format!(
                    "'tools[{i}].name' must be a non-empty string, not {}",
                    other.unwrap_or(&Value::Null)
                ))
            }
        };
        let schema = match tool.get("input_schema") {
            Some(schema @ Value::Object(_)) => schema,
            other => {
                return bad(format!(
                    "'tools[{i}].input_schema' must be a JSON Schema object, not {}",
                    other.unwrap_or(&Value::Null)
                ))
            }
        };
        let mut function = json!({ "name": name, "parameters": schema });
        match tool.get("description") {
            None | Some(Value::Null) => {}
            Some(d @ Value::String(_)) => function["description"] = d.clone(),
            Some(other) => {
                return bad(format!(
                    "'tools[{i}].description' must be a string, not {other}"
                ))
            }
        }
        out.push(json!({ "type": "function", "function": function }));
    }
    Ok(Some(Value::Array(out)))
}

/// Anthropic's `tool_choice` as OpenAI's `tool_choice` and
/// `parallel_tool_calls`: `auto`, `any` (some tool: `required`), `tool`
/// (this one), `none`.
fn tool_choice(value: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("tool_choice")));
    let mut out = Map::new();
    let choice = match value {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(choice)) => choice,
        Some(other) => {
            return bad(format!(
                "'tool_choice' must be an object such as {{\"type\": \"auto\"}}, not {other}"
            ))
        }
    };
    if !choice
        .get("name")
        .is_none_or(|n| n.is_string() || n.is_null())
    {
        return bad("'tool_choice.name' must be a string: the tool's name".into());
    }
    let openai = match (
        choice.get("type").and_then(Value::as_str),
        choice.get("name"),
    ) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(Value::String(name))) => {
            json!({ "type": "function", "function": { "name": name } })
        }
        (Some("tool"), _) => {
            return bad("'tool_choice' of type \"tool\" needs the tool's 'name'".into())
        }
        _ => {
            return bad(format!(
                "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", not {}",
                choice.get("type").unwrap_or(&Value::Null)
            ))
        }
    };
    out.insert("tool_choice".into(), openai);
    match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(disable)) => {
            out.insert("parallel_tool_calls".into(), json!(!disable));
        }
        Some(other) => {
            return bad(format!(
                "'tool_choice.disable_parallel_tool_use' must be true or false, not {other}"
            ))
        }
    }
    Ok(out)
}

/// One turn's content blocks as OpenAI messages: a user turn's
/// `tool_result` blocks become `tool` messages (before the turn's text);
/// an assistant turn's `tool_use` blocks become its `tool_calls`; a user
/// turn's `image` blocks become `image_url` parts beside its text parts,
/// in order (checked then like OpenAI's own).
/// `thinking` blocks the client sends back are the model's own earlier
/// reasoning, which chat templates leave out of the history: dropped.
fn turn_blocks(
    i: usize,
    role: &str,
    blocks: &[Value],
    chat: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("messages")));
    let mut texts: Vec<&str> = Vec::new();
    // With an image, the user turn's parts in order: its texts and images.
    let mut parts: Vec<Value> = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let name = format!("messages[{i}].content[{j}]");
        match (role, block.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => match block.get("text") {
                Some(Value::String(text)) => {
                    texts.push(text);
                    parts.push(json!({ "type": "text", "text": text }));
                }
                other => {
                    return bad(format!(
                        "'{name}.text' must be a string, not {}",
                        other.unwrap_or(&Value::Null)
                    ))
                }
            },
            ("user", Some("image")) => {
                let source = block.get("source");
                let url = match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
                    Some("base64") => match (source.and_then(|s| s.get("media_type")), source.and_then(|s| s.get("data"))) {
                        (Some(Value::String(media)), Some(Value::String(data))) => format!("data:{media};base64,{data}"),
                        _ => return bad(format!("'{name}.source' must have a string 'media_type' (image/png, image/jpeg, image/gif, image/webp) and 'data' (base64)")),
                    },
                    Some("url") => match source.and_then(|s| s.get("url")) {
                        Some(Value::String(url)) => url.clone(),
                        _ => return bad(format!("'{name}.source.url' must be a string")),
                    },
                    _ => return bad(format!("'{name}.source' must be an object whose 'type' is \"base64\" (with media_type and data)")),
                };
                let image = json!({ "type": "image_url", "image_url": { "url": url } });
                if let Err(why) = super::validate::image_part(&image) {
                    return bad(format!("'{name}.{}", why.replacen("image_url.url'", "source'", 1)));
                }
                parts.push(image);
            }
            ("assistant", Some(kind @ ("thinking" | "redacted_thinking"))) => {
                let fields: &[&str] = match kind {
                    "thinking" => &["thinking", "signature"],
                    _ => &["data"],
                };
                if let Some(field) = fields.iter().find(|f| !block.get(**f).is_some_and(Value::is_string)) {
                    return bad(format!("'{name}.{field}' must be a string"));
                }
            }
            ("assistant", Some("tool_use")) => {
                let (Some(Value::String(id)), Some(Value::String(tool))) =
                    (block.get("id"), block.get("name"))
                else {
                    return bad(format!("'{name}' is a tool_use block without a string 'id' and 'name'"));
                };
                let input = match block.get("input") {
                    Some(input @ Value::Object(_)) => input.to_string(),
                    other => return bad(format!("'{name}.input' must be an object, not {}", other.unwrap_or(&Value::Null))),
                };
                calls.push(json!({ "id": id, "type": "function",
                                   "function": { "name": tool, "arguments": input } }));
            }
            ("user", Some("tool_result")) => {
                let Some(Value::String(id)) = block.get("tool_use_id") else {
                    return bad(format!("'{name}.tool_use_id' must be a string: the id of the tool_use block it answers"));
                };
                let content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(content) => text_of(content, &format!("{name}.content"))?,
                };
                let content = match block.get("is_error") {
                    Some(Value::Bool(true)) => format!("Error: {content}"),
                    None | Some(Value::Null) | Some(Value::Bool(false)) => content,
                    Some(other) => return bad(format!("'{name}.is_error' must be true or false, not {other}")),
                };
                chat.push(json!({ "role": "tool", "tool_call_id": id, "content": content }));
            }
            (_, Some(kind @ ("tool_use" | "tool_result" | "thinking" | "redacted_thinking"))) => {
                return bad(format!("'{name}' is a '{kind}' block, which only {} turns carry", if kind == "tool_result" { "user" } else { "assistant" }))
            }
            (_, Some(kind)) => {
                return bad(format!(
                    "'{name}' is a '{kind}' block; this host serves text blocks ({{\"type\": \"text\", \"text\": \"...\"}}), and tool_use and tool_result blocks for tools"
                ))
            }
            (_, None) => {
                return bad(format!(
                    "'{name}' must be a block object such as {{\"type\": \"text\", \"text\": \"...\"}}, not {block}"
                ))
            }
        }
    }
    if parts.iter().any(|p| p["type"] == "image_url") {
        chat.push(json!({ "role": role, "content": parts }));
        return Ok(());
    }
    let text = (!texts.is_empty()).then(|| texts.join("\n"));
    match (role, text, calls.is_empty()) {
        ("assistant", text, false) => chat.push(json!({
            "role": "assistant", "content": text, "tool_calls": calls,
        })),
        (_, Some(text), _) => chat.push(json!({ "role": role, "content": text })),
        (_, None, _) => {}
    }
    Ok(())
}

/// `stop_sequences`: a list of non-empty strings.
fn stop_sequences(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("stop_sequences")));
    match value {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(items)) => {
            let mut stops = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.is_empty() => stops.push(s.clone()),
                    _ => {
                        return bad(format!(
                            "'stop_sequences[{i}]' must be a non-empty string, not {item}"
                        ))
                    }
                }
            }
            Ok(stops)
        }
        Some(other) => bad(format!(
            "'stop_sequences' must be a list of strings, not {other}"
        )),
    }
}

/// The text of a string or of a list of text blocks (`system`, a turn's
/// `content`), blocks joined by newlines.
fn text_of(value: &Value, name: &str) -> Result<String, ApiError> {
    let param = if name == "system" {
        "system"
    } else {
        "messages"
    };
    let bad = |what: String| Err(ApiError::bad_request(what, Some(param)));
    let blocks = match value {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(blocks) if !blocks.is_empty() => blocks,
        Value::Array(_) => return bad(format!("'{name}' must not be an empty list of blocks")),
        other => {
            return bad(format!(
                "'{name}' must be a string or a list of text blocks, not {other}"
            ))
        }
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, block) in blocks.iter().enumerate() {
        match (block.get("type"), block.get("text")) {
            (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => {
                texts.push(text.as_str())
            }
            (Some(Value::String(t)), _) if t == "text" => {
                return bad(format!(
                    "'{name}[{j}].text' must be a string, not {}",
                    block.get("text").unwrap_or(&Value::Null)
                ))
            }
            (Some(Value::String(t)), _) => {
                return bad(format!(
                    "'{name}[{j}]' is a '{t}' block; this host serves text blocks only ({{\"type\": \"text\", \"text\": \"...\"}})"
                ))
            }
            _ => {
                return bad(format!(
                    "'{name}[{j}]' must be a block object such as {{\"type\": \"text\", \"text\": \"...\"}}, not {block}"
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The answer to the client from the engine's `response` (which the proxy
/// gave in OpenAI's shapes).
async fn answer_with(response: Response, ask: Ask) -> Response {
    let mut translator = Translator::new(ask.stops.clone());
    let id = format!("msg_{}", super::inprocess::unique());
    if ask.stream && pieces::streams(&response) {
        return pieces::stream(response, Events::new(id, ask.model, translator));
    }
    let mut blocks = Blocks::default();
    match pieces::gather(response, &mut translator, |p| blocks.extend(p)).await {
        Ok(()) => whole(&id, &ask, &translator, blocks),
        Err(e) => error_response(&e),
    }
}

/// A whole message's content blocks, gathered from the pieces.
#[derive(Debug, Default)]
struct Blocks {
    blocks: Vec<Value>,
    /// The open tool call's input so far (JSON text).
    input: String,
}

impl Blocks {
    fn extend(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            let last = self.blocks.last_mut();
            let kind = last.as_ref().and_then(|b| b["type"].as_str());
            match (piece, kind) {
                (Piece::Text(t), Some("text")) => append(last, "text", &t),
                (Piece::Text(t), _) => {
                    self.close();
                    self.blocks.push(json!({ "type": "text", "text": t }));
                }
                (Piece::Thinking(t), Some("thinking")) => append(last, "thinking", &t),
                (Piece::Thinking(t), _) => {
                    self.close();
                    self.blocks
                        .push(json!({ "type": "thinking", "thinking": t, "signature": "" }));
                }
                (Piece::ToolUse { id, name }, _) => {
                    self.close();
                    self.blocks
                        .push(json!({ "type": "tool_use", "id": id, "name": name, "input": {} }));
                }
                (Piece::Input(json), _) => self.input.push_str(&json),
            }
        }
    }

    /// Ends the open tool call: its input text becomes `input`.
    fn close(&mut self) {
        let input = std::mem::take(&mut self.input);
        let Some(block) = self.blocks.last_mut() else {
            return;
        };
        if block["type"] != "tool_use" || input.is_empty() {
            return;
        }
        match serde_json::from_str::<Value>(&input) {
            Ok(value @ Value::Object(_)) => block["input"] = value,
            _ => tracing::warn!(
                "tool call '{}' has arguments that are not a JSON object; its input is left empty: {}",
                block["name"],
                input.chars().take(200).collect::<String>()
            ),
        }
    }

    fn finish(mut self) -> Vec<Value> {
        self.close();
        if self.blocks.is_empty() {
            self.blocks.push(json!({ "type": "text", "text": "" }));
        }
        self.blocks
    }
}

/// Appends `text` to a block's `field`.
fn append(block: Option<&mut Value>, field: &str, text: &str) {
    if let Some(Value::String(s)) = block.and_then(|b| b.get_mut(field)) {
        s.push_str(text);
    }
}

/// A whole (non-streamed) message.
fn whole(id: &str, ask: &Ask, translator: &Translator, blocks: Blocks) -> Response {
    Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": ask.model,
        "content": blocks.finish(),
        "stop_reason": translator.stop_reason(),
        "stop_sequence": translator.stop_sequence,
        "usage": translator.usage(),
    }))
    .into_response()
}

/// The kind of the content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    ToolUse,
}

/// Anthropic's events for one streamed message, written as server-sent
/// events with `event:` lines. Blocks open as their first piece comes and
/// close when another kind begins: thinking, text, then tool_use blocks,
/// as the model wrote them.
struct Events {
    id: String,
    model: String,
    translator: Translator,
    started: bool,
    /// The block open now, at index `index`.
    open: Option<Open>,
    index: usize,
}

impl Events {
    fn new(id: String, model: String, translator: Translator) -> Events {
        Events {
            id,
            model,
            translator,
            started: false,
            open: None,
            index: 0,
        }
    }

    fn write(out: &mut String, name: &str, data: Value) {
        out.push_str("event: ");
        out.push_str(name);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    /// `message_start`, once.
    fn start(&mut self, out: &mut String) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        Events::write(
            out,
            "message_start",
            json!({ "type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": { "input_tokens": 0, "output_tokens": 0 },
            }}),
        );
    }

    /// The events one engine event makes; `true` once the message is over.
    fn event_of(&mut self, event: &[u8], out: &mut String) -> bool {
        self.start(out);
        match self.translator.event(event) {
            Step::Pieces(pieces) => {
                self.pieces(pieces, out);
                if self.translator.done {
                    self.finish(out);
                }
                self.translator.done
            }
            Step::Error(e) => {
                Events::fail(&e, out);
                true
            }
        }
    }

    /// Opens a block of `kind` (closing another) unless one is open.
    fn open(&mut self, kind: Open, block: Value, out: &mut String) {
        if self.open == Some(kind) && kind != Open::ToolUse {
            return;
        }
        self.close(out);
        self.open = Some(kind);
        Events::write(
            out,
            "content_block_start",
            json!({ "type": "content_block_start", "index": self.index, "content_block": block }),
        );
    }

    fn close(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            Events::write(
                out,
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": self.index }),
            );
            self.index += 1;
        }
    }

    fn delta(&self, delta: Value, out: &mut String) {
        Events::write(
            out,
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": self.index, "delta": delta }),
        );
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut String) {
        for piece in pieces {
            match piece {
                Piece::Text(text) => {
                    self.open(Open::Text, json!({ "type": "text", "text": "" }), out);
                    self.delta(json!({ "type": "text_delta", "text": text }), out);
                }
                Piece::Thinking(thinking) => {
                    let block = json!({ "type": "thinking", "thinking": "", "signature": "" });
                    self.open(Open::Thinking, block, out);
                    self.delta(
                        json!({ "type": "thinking_delta", "thinking": thinking }),
                        out,
                    );
                }
                Piece::ToolUse { id, name } => {
                    let block = json!({ "type": "tool_use", "id": id, "name": name, "input": {} });
                    self.open(Open::ToolUse, block, out);
                }
                Piece::Input(json) if self.open == Some(Open::ToolUse) => {
                    self.delta(
                        json!({ "type": "input_json_delta", "partial_json": json }),
                        out,
                    );
                }
                Piece::Input(_) => {}
            }
        }
    }

    /// The closing events: the last block's stop, why and how much, the end.
    fn finish(&mut self, out: &mut String) {
        self.start(out);
        let held = self.translator.flush();
        self.pieces(held, out);
        if self.open.is_none() && self.index == 0 {
            // Every message has a block, if only an empty text.
            self.open(Open::Text, json!({ "type": "text", "text": "" }), out);
        }
        self.close(out);
        Events::write(
            out,
            "message_delta",
            json!({ "type": "message_delta",
                    "delta": { "stop_reason": self.translator.stop_reason(),
                               "stop_sequence": self.translator.stop_sequence },
                    "usage": self.translator.usage() }),
        );
        Events::write(out, "message_stop", json!({ "type": "message_stop" }));
    }

    fn fail(e: &ApiError, out: &mut String) {
        Events::write(out, "error", error_body(e));
    }
}

impl pieces::Events for Events {
    fn event(&mut self, event: &[u8], out: &mut String) -> bool {
        self.event_of(event, out)
    }

    fn end(&mut self, out: &mut String) {
        self.finish(out);
    }

    fn error(&mut self, e: &ApiError, out: &mut String) {
        Events::fail(e, out);
    }
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

fn error_body(e: &ApiError) -> Value {
    json!({ "type": "error", "error": { "type": error_type(e.status), "message": e.message } })
}

/// An error in Anthropic's shape, with the status (and `retry-after`) the
/// OpenAI routes would give.
pub(super) fn error_response(e: &ApiError) -> Response {
    let mut response = (e.status, Json(error_body(e))).into_response();
    if let Some(secs) = e.retry_after {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert("retry-after", v);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    /// Translates a request and renders the OpenAI request, or the error.
    fn check(request: Value, expect: Expect) {
        let verdict = match translate(request.to_string().as_bytes()) {
            Ok((openai, ask)) => format!(
                "{}\nstream={} stops={:?}",
                Value::Object(openai),
                ask.stream,
                ask.stops
            ),
            Err(e) => format!(
                "{} {} {:?}: {}",
                e.status.as_u16(),
                error_type(e.status),
                e.param,
                e.message
            ),
        };
        expect.assert_eq(&verdict);
    }

    /// Feeds engine chunks (each one event's data) and renders the
    /// Anthropic events, one line each.
    fn check_stream(stops: &[&str], chunks: &[&str], expect: Expect) {
        let translator = Translator::new(stops.iter().map(|s| s.to_string()).collect());
        let mut events = Events::new("msg_1".into(), "m".into(), translator);
        let mut out = String::new();
        for chunk in chunks {
            if events.event_of(format!("data: {chunk}\n\n").as_bytes(), &mut out) {
                break;
            }
        }
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("event: "))
            .map(|l| l.trim_start_matches("data: "))
            .collect();
        expect.assert_eq(&lines.join("\n"));
    }

    fn delta(text: &str) -> String {
        json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
            .to_string()
    }

    #[test]
    fn a_request_becomes_a_streamed_chat_request() {
        check(
            json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                   "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo", "cache_control": {"type": "ephemeral"}}]}],
                   "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["\n\n"], "stream": true, "metadata": {"user_id": "u"}}),
            expect![[r#"
                {"max_tokens":8,"messages":[{"content":"Be brief.\nBe kind.","role":"system"},{"content":"hi","role":"user"},{"content":"yo","role":"assistant"}],"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_k":40,"top_p":0.9}
                stream=true stops=["\n\n"]"#]],
        );
    }

    #[test]
    fn every_field_is_checked_by_name() {
        let base = || json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut r = base();
            r[k] = v;
            r
        };
        let mut no_max = base();
        no_max.as_object_mut().unwrap().remove("max_tokens");
        check(
            no_max,
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' is required: the most tokens to generate, a whole number from 1"#
            ]],
        );
        check(
            with("max_tokens", json!(0)),
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 0"#
            ]],
        );
        check(
            with("max_tokens", json!(2.5)),
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 2.5"#
            ]],
        );
        check(
            with("temperature", json!(1.5)),
            expect![[
                r#"400 invalid_request_error Some("temperature"): 'temperature' must be a number from 0 to 1, not 1.5"#
            ]],
        );
        check(
            with("top_p", json!("x")),
            expect![[
                r#"400 invalid_request_error Some("top_p"): 'top_p' must be a number from 0 to 1, not "x""#
            ]],
        );
        check(
            with("top_k", json!(-1)),
            expect![[
                r#"400 invalid_request_error Some("top_k"): 'top_k' must be a whole number from 0 to 4294967295, not -1"#
            ]],
        );
        check(
            with("stream", json!(1)),
            expect![[
                r#"400 invalid_request_error Some("stream"): 'stream' must be true or false, not 1"#
            ]],
        );
        check(
            with("stop_sequences", json!("x")),
            expect![[
                r#"400 invalid_request_error Some("stop_sequences"): 'stop_sequences' must be a list of strings, not "x""#
            ]],
        );
        check(
            with("stop_sequences", json!(["a", ""])),
            expect![[
                r#"400 invalid_request_error Some("stop_sequences"): 'stop_sequences[1]' must be a non-empty string, not """#
            ]],
        );
        check(
            with("system", json!(5)),
            expect![[
                r#"400 invalid_request_error Some("system"): 'system' must be a string or a list of text blocks, not 5"#
            ]],
        );
        check(
            with("metadata", json!("u")),
            expect![[
                r#"400 invalid_request_error Some("metadata"): 'metadata' must be an object such as {"user_id": "..."}, not "u""#
            ]],
        );
        check(
            with("container", json!("x")),
            expect![[
                r#"400 invalid_request_error Some("container"): 'container' is not supported by this host (it serves: model, messages, max_tokens, system, stop_sequences, stream, temperature, top_p, top_k, metadata, tools, tool_choice)"#
            ]],
        );
        check(
            with("model", json!("")),
            expect![[
                r#"400 invalid_request_error Some("model"): 'model' is required: a string naming one of the models GET /v1/models lists"#
            ]],
        );
        check(
            with("messages", json!([])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages' is required: a non-empty list of {"role", "content"} turns"#
            ]],
        );
        check(
            with("messages", json!([{"role": "system", "content": "x"}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].role' must be "user" or "assistant" (the system prompt is the top-level 'system'), not "system""#
            ]],
        );
        check(
            with("messages", json!([{"role": "user"}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content' is missing"#
            ]],
        );
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0].source' must be an object whose 'type' is "base64" (with media_type and data)"#
            ]],
        );
        check(
            with(
                "messages",
                json!([{"role": "assistant", "content": [{"type": "image", "source": {}}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0]' is a 'image' block; this host serves text blocks ({"type": "text", "text": "..."}), and tool_use and tool_result blocks for tools"#
            ]],
        );
        // An image block is an image_url part beside the turn's text.
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
                    {"type": "text", "text": "what is this?"},
                ]}]),
            ),
            expect![[r#"
                {"max_tokens":8,"messages":[{"content":[{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"},{"text":"what is this?","type":"text"}],"role":"user"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}
                stream=false stops=[]"#]],
        );
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0].text' must be a string, not 5"#
            ]],
        );
        check(
            with("messages", json!([{"role": "user", "content": []}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content' must not be an empty list of blocks"#
            ]],
        );
    }

    #[test]
    fn a_stream_becomes_anthropic_events_in_order() {
        check_stream(
            &[],
            &[
                &delta("Hel"),
                &delta("lo"),
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
                "[DONE]",
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"Hel","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"lo","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"max_tokens","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":5,"output_tokens":2}}
                {"type":"message_stop"}"#]],
        );
    }

    #[test]
    fn a_stop_sequence_split_across_chunks_ends_the_message() {
        // "END" arrives as "E" + "ND": the "E" is held back, never shown.
        check_stream(
            &["END", "xyz"],
            &[
                &delta("ab"),
                &delta("cE"),
                &delta("ND tail"),
                &delta("never"),
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"ab","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"c","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":3}}
                {"type":"message_stop"}"#]],
        );
        // A held prefix that turns out not to be one is passed on; the end
        // of the turn flushes what is held.
        check_stream(
            &["END"],
            &[
                &delta("aE"),
                &delta("x"),
                &delta("E"),
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"a","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"Ex","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"E","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"end_turn","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":3}}
                {"type":"message_stop"}"#]],
        );
    }

    #[test]
    fn an_engine_error_mid_stream_becomes_an_error_event() {
        check_stream(
            &[],
            &[
                &delta("a"),
                r#"{"error":{"message":"engine 'mlx-lm' exited","type":"engine_error"}}"#,
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"a","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"error":{"message":"engine 'mlx-lm' exited","type":"api_error"},"type":"error"}"#]],
        );
    }

    #[test]
    fn tools_and_tool_blocks_become_openais() {
        check(
            json!({"model": "m", "max_tokens": 8,
                   "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
                   "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
                   "messages": [
                       {"role": "user", "content": "weather?"},
                       {"role": "assistant", "content": [
                           {"type": "thinking", "thinking": "hmm", "signature": ""},
                           {"type": "text", "text": "Let me look."},
                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                           {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": true},
                           {"type": "text", "text": "Thanks"}]}]}),
            expect![[r#"
                {"max_tokens":8,"messages":[{"content":"weather?","role":"user"},{"content":"Let me look.","role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"toolu_1","type":"function"}]},{"content":"Sunny","role":"tool","tool_call_id":"toolu_1"},{"content":"Error: down","role":"tool","tool_call_id":"toolu_2"},{"content":"Thanks","role":"user"}],"model":"m","parallel_tool_calls":false,"stream":true,"stream_options":{"include_usage":true},"tool_choice":{"function":{"name":"get_weather"},"type":"function"},"tools":[{"function":{"description":"d","name":"get_weather","parameters":{"type":"object"}},"type":"function"}]}
                stream=false stops=[]"#]],
        );
        let base = || json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut r = base();
            r[k] = v;
            r
        };
        check(
            with(
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("tools"): 'tools[0]' is a 'web_search_20250305' tool, which runs on Anthropic's servers; this host serves client tools ({"name", "input_schema"}) only"#
            ]],
        );
        check(
            with("tools", json!([{"name": "x"}])),
            expect![[
                r#"400 invalid_request_error Some("tools"): 'tools[0].input_schema' must be a JSON Schema object, not null"#
            ]],
        );
        check(
            with("tool_choice", json!({"type": "any"})),
            expect![[r#"
            {"max_tokens":8,"messages":[{"content":"hi","role":"user"}],"model":"m","stream":true,"stream_options":{"include_usage":true},"tool_choice":"required"}
            stream=false stops=[]"#]],
        );
        check(
            with("tool_choice", json!({"type": "auto", "name": {}})),
            expect![[
                r#"400 invalid_request_error Some("tool_choice"): 'tool_choice.name' must be a string: the tool's name"#
            ]],
        );
        check(
            with("tool_choice", json!({"type": "some"})),
            expect![[
                r#"400 invalid_request_error Some("tool_choice"): 'tool_choice.type' must be "auto", "any", "tool" or "none", not "some""#
            ]],
        );
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0]' is a 'tool_use' block, which only assistant turns carry"#
            ]],
        );
    }

    fn call_delta(call: Value) -> String {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
            .to_string()
    }

    #[test]
    fn reasoning_and_tool_calls_become_blocks() {
        check_stream(
            &[],
            &[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"think"},"finish_reason":null}]}"#,
                &delta("Sure."),
                &call_delta(
                    json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
                ),
                &call_delta(json!({"index": 0, "function": {"arguments": "{\"city\":"}})),
                &call_delta(json!({"index": 0, "function": {"arguments": "\"Paris\"}"}})),
                &call_delta(
                    json!({"index": 1, "id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}}),
                ),
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                "[DONE]",
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"signature":"","thinking":"","type":"thinking"},"index":0,"type":"content_block_start"}
                {"delta":{"thinking":"think","type":"thinking_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"content_block":{"text":"","type":"text"},"index":1,"type":"content_block_start"}
                {"delta":{"text":"Sure.","type":"text_delta"},"index":1,"type":"content_block_delta"}
                {"index":1,"type":"content_block_stop"}
                {"content_block":{"id":"call_1","input":{},"name":"get_weather","type":"tool_use"},"index":2,"type":"content_block_start"}
                {"delta":{"partial_json":"{\"city\":","type":"input_json_delta"},"index":2,"type":"content_block_delta"}
                {"delta":{"partial_json":"\"Paris\"}","type":"input_json_delta"},"index":2,"type":"content_block_delta"}
                {"index":2,"type":"content_block_stop"}
                {"content_block":{"id":"call_2","input":{},"name":"add","type":"tool_use"},"index":3,"type":"content_block_start"}
                {"delta":{"partial_json":"{}","type":"input_json_delta"},"index":3,"type":"content_block_delta"}
                {"index":3,"type":"content_block_stop"}
                {"delta":{"stop_reason":"tool_use","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":1}}
                {"type":"message_stop"}"#]],
        );
    }
}
