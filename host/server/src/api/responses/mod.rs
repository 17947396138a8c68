//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's
//! Responses API (what Codex and newer SDKs call), translated by the host to
//! the OpenAI chat request every engine already serves, as `/v1/messages`
//! is.
//!
//! A request is validated here field by field, each error naming its
//! field (fields this host does not serve are refused by name, as on
//! `/v1/messages`), and turned into a chat request: `instructions` as the
//! system message, `input` (a string, or message, `function_call`,
//! `function_call_output` and `reasoning` items) as the turns, the flat
//! function `tools` as chat's nested ones, `text.format` as
//! `response_format`, `reasoning.effort` as `reasoning_effort`,
//! `max_output_tokens` as `max_tokens`. It goes through
//! [`super::openai::proxy`], the one path every engine request takes
//! (validation, gating, admission, metrics, and the host's parsing of tool
//! calls and reasoning), always as a stream with usage; the engine's
//! pieces become the response's output items ([`stream`]), streamed as the
//! Responses API's events or gathered into one response.
//!
//! Responses are stored ([`store`]) unless the request says `store: false`;
//! `previous_response_id` puts the stored conversation (every earlier input
//! item and output item; not the earlier `instructions`, as OpenAI does)
//! before this request's input. Errors are in OpenAI's shape.

pub(crate) mod store;
mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::images::ImageNames;
use super::pieces::{self, StopReason, Translator};
use super::{validate, ApiError, App, PathId};
pub(crate) use store::Store;
use stream::{Output, Streamed};

/// The route, as the metrics label it.
const ROUTE: &str = "/v1/responses";

/// The fields of a request this host serves; any other is refused by name.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "store",
    "previous_response_id",
    "text",
    "reasoning",
    "metadata",
    "user",
    "truncation",
    "include",
    "background",
    "prompt_cache_key",
];

/// `POST /v1/responses`.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    request_body(content = super::schema::ResponsesRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The response, whole or streamed", content((super::schema::ResponseObject = "application/json"), (super::schema::SseEvent = "text/event-stream"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn create(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let translated = body
        .map_err(ApiError::from)
        .and_then(|b| translate(&b, &app.responses));
    let store = app.responses.clone();
    let answer = |response, ask| answer_with(response, ask, store);
    pieces::through_proxy(app, ROUTE, translated, answer, |e| {
        e.clone().into_response()
    })
    .await
}

/// `GET /v1/responses/{id}`: a stored response.
#[utoipa::path(get, path = "/v1/responses/{id}", tag = "openai",
    params(("id" = String, Path, description = "The response's id (`resp_...`)")),
    responses(
        (status = 200, description = "The stored response", body = super::schema::ResponseObject),
        (status = "4XX", description = "No response of that id is stored", body = super::schema::Error)
    ))]
pub(super) async fn retrieve(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    match app.responses.get(&id) {
        Some(record) => Ok(Json(record.response)),
        None => Err(not_found(&id, None)),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
#[utoipa::path(delete, path = "/v1/responses/{id}", tag = "openai",
    params(("id" = String, Path, description = "The response's id (`resp_...`)")),
    responses(
        (status = 200, description = "Deleted", body = super::schema::DeletedResponse),
        (status = "4XX", description = "No response of that id is stored", body = super::schema::Error)
    ))]
pub(super) async fn remove(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    match app.responses.delete(&id) {
        true => Ok(Json(
            json!({ "id": id, "object": "response", "deleted": true }),
        )),
        false => Err(not_found(&id, None)),
    }
}

/// OpenAI's 404 for a response id it does not hold.
fn not_found(id: &str, param: Option<&'static str>) -> ApiError {
    ApiError {
        param: param.map(Into::into),
        ..ApiError::not_found(format!("Response with id '{id}' not found."))
    }
}

/// What the translation keeps for the answer: the response's id, what it
/// echoes of the request, and where it is stored.
#[derive(Debug)]
pub(super) struct Ask {
    id: String,
    stream: bool,
    /// Whether the response is stored.
    store: bool,
    /// The conversation before this response's output (stored with it).
    conversation: Vec<Value>,
    /// The fields of the response object that echo the request.
    echo: Map<String, Value>,
    /// Where the conversation's images are, as the client named them.
    images: ImageNames,
}

impl super::pieces::NamesImages for Ask {
    fn image_names(&self) -> ImageNames {
        self.images.clone()
    }
}

impl Ask {
    /// The response object with `status`, `output` and `error`.
    fn response(&self, status: &str, output: Vec<Value>, error: Value) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "status": status,
            "output": output,
            "error": error,
            "incomplete_details": null,
            "usage": null,
        });
        if let Value::Object(fields) = &mut response {
            fields.extend(self.echo.clone());
        }
        response
    }
}

/// The finished response: the last item closed, why it ended, its usage.
fn finished(ask: &Ask, translator: &Translator, output: &mut Output, out: &mut String) -> Value {
    let cut = translator.reason() == StopReason::MaxTokens;
    output.close(if cut { "incomplete" } else { "completed" }, out);
    let status = if cut { "incomplete" } else { "completed" };
    let mut response = ask.response(status, output.items(), Value::Null);
    if cut {
        response["incomplete_details"] = json!({ "reason": "max_output_tokens" });
    }
    let (input, output) = translator.tokens();
    response["usage"] = json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": input + output,
    });
    response
}

/// Stores a finished response, unless its request said `store: false`. The
/// write is small and synchronous on purpose: a client that asks for a
/// follow-up as soon as it has the response finds it stored.
fn keep(store: &Store, ask: &Ask, response: &Value) {
    if !ask.store {
        return;
    }
    let record = store::Record {
        response: response.clone(),
        input: ask.conversation.clone(),
    };
    if let Err(e) = store.put(&ask.id, &record) {
        tracing::warn!(
            "response '{}' was not stored (a follow-up naming it will get a 404): {e}",
            ask.id
        );
    }
}

/// The answer to the client from the engine's `response` (which the proxy
/// gave in OpenAI's shapes).
async fn answer_with(response: Response, ask: Ask, store: Arc<Store>) -> Response {
    let mut translator = Translator::new(vec![]);
    if ask.stream && pieces::streams(&response) {
        return pieces::stream(response, Streamed::new(ask, translator, store));
    }
    let mut output = Output::default();
    // The events a stream would carry, discarded: the items are the same.
    let mut events = String::new();
    let gathered = pieces::gather(response, &mut translator, |p| {
        output.pieces(p, &mut events);
        events.clear();
    })
    .await;
    match gathered {
        Ok(()) => {
            let response = finished(&ask, &translator, &mut output, &mut events);
            keep(&store, &ask, &response);
            Json(response).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A 400 naming `param`.
fn bad<T>(param: &'static str, what: String) -> Result<T, ApiError> {
    Err(ApiError::bad_request(what, Some(param)))
}

/// A string field, or `None` when absent.
fn string<'a>(
    request: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a str>, ApiError> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => bad(name, format!("'{name}' must be a string, not {other}")),
    }
}

/// Validates a Responses request and translates it to an OpenAI chat
/// request (always streamed, with usage), reading the stored conversation
/// a `previous_response_id` names.
pub(super) fn translate(body: &[u8], store: &Store) -> Result<(Map<String, Value>, Ask), ApiError> {
    let request: Map<String, Value> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not a JSON object: {e}"), None)
    })?;
    if let Some(name) = request.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            format!(
                "'{name}' is not supported by this host (it serves: {})",
                FIELDS.join(", ")
            ),
            None,
        ));
    }
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return bad(
                "model",
                "'model' is required: a string naming one of the models GET /v1/models lists"
                    .into(),
            )
        }
    };
    if validate::flag(request.get("background"), "background")? == Some(true) {
        return bad("background", "'background' responses are not supported by this host: it answers while the request is open; leave 'background' out or false".into());
    }
    let stream = validate::flag(request.get("stream"), "stream")?.unwrap_or(false);
    let keep = validate::flag(request.get("store"), "store")?.unwrap_or(true);
    let parallel = validate::flag(request.get("parallel_tool_calls"), "parallel_tool_calls")?;
    let instructions = string(&request, "instructions")?;
    let previous = string(&request, "previous_response_id")?;
    let user = string(&request, "user")?;
    string(&request, "prompt_cache_key")?;
    let truncation = match string(&request, "truncation")? {
        None => "disabled",
        Some(t @ ("auto" | "disabled")) => t,
        Some(other) => {
            return bad(
                "truncation",
                format!("'truncation' must be \"auto\" or \"disabled\", not \"{other}\""),
            )
        }
    };
    match request.get("include") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
        Some(other) => {
            return bad(
                "include",
                format!("'include' must be a list of strings, not {other}"),
            )
        }
    }
    let metadata = metadata(request.get("metadata"))?;
    let max_output_tokens =
        validate::tokens(request.get("max_output_tokens"), "max_output_tokens")?;
    let temperature = validate::number(request.get("temperature"), "temperature")?;
    let top_p = validate::number(request.get("top_p"), "top_p")?;

    // The conversation: the stored one, then this request's input.
    let mut conversation = match previous {
        None => vec![],
        Some(id) => {
            let record = store
                .get(id)
                .ok_or_else(|| not_found(id, Some("previous_response_id")))?;
            let mut items = record.input;
            items.extend(
                record.response["output"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            items
        }
    };
    let fresh = conversation.len();
    match request.get("input") {
        Some(Value::String(text)) => {
            conversation.push(json!({ "type": "message", "role": "user", "content": text }))
        }
        Some(Value::Array(items)) if !items.is_empty() => conversation.extend(items.iter().cloned()),
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return bad("input", "'input' is required: a string, or a non-empty list of items ({\"role\": \"user\", \"content\": \"...\"}, function_call_output, ...)".into())
        }
        Some(other) => {
            return bad(
                "input",
                format!("'input' must be a string or a list of items, not {other}"),
            )
        }
    }
    let mut chat = Vec::new();
    if let Some(instructions) = instructions {
        chat.push(json!({ "role": "system", "content": instructions }));
    }
    let mut images = ImageNames {
        param: Some("input"),
        paths: Vec::new(),
    };
    for (i, item) in conversation.iter().enumerate() {
        // Stored items were checked when they came; this request's are
        // named by their index in its `input`.
        let name = match i.checked_sub(fresh) {
            Some(i) => format!("input[{i}]"),
            None => format!("the stored conversation's item {i}"),
        };
        turn(&name, item, &mut chat)?;
        // A user message's `input_image` parts become the chat's image
        // parts, in order.
        if let (Some("user"), Some(Value::Array(parts))) = (
            item.get("role").and_then(Value::as_str),
            item.get("content"),
        ) {
            for (j, part) in parts.iter().enumerate() {
                if part.get("type").and_then(Value::as_str) == Some("input_image") {
                    images.paths.push(format!("{name}.content[{j}].image_url"));
                }
            }
        }
    }

    let mut openai = Map::new();
    openai.insert("model".into(), json!(model));
    openai.insert("messages".into(), Value::Array(chat));
    if let Some(n) = max_output_tokens {
        openai.insert("max_tokens".into(), json!(n));
    }
    if let Some(t) = temperature {
        openai.insert("temperature".into(), json!(t));
    }
    if let Some(p) = top_p {
        openai.insert("top_p".into(), json!(p));
    }
    let tools_sent = request.get("tools").filter(|v| !v.is_null());
    if let Some(tools) = tools(tools_sent)? {
        openai.insert("tools".into(), tools);
    }
    let choice = request.get("tool_choice").filter(|v| !v.is_null());
    if let Some(choice) = tool_choice(choice)? {
        openai.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = parallel {
        openai.insert("parallel_tool_calls".into(), json!(parallel));
    }
    let text = request.get("text").filter(|v| !v.is_null());
    if let Some(format) = text_format(text)? {
        openai.insert("response_format".into(), format);
    }
    let reasoning = request.get("reasoning").filter(|v| !v.is_null());
    if let Some(effort) = effort(reasoning)? {
        openai.insert("reasoning_effort".into(), json!(effort));
    }
    openai.insert("stream".into(), json!(true));
    openai.insert("stream_options".into(), json!({ "include_usage": true }));

    let id = format!("resp_{}", super::inprocess::unique());
    let mut echo = Map::new();
    let mut set = |k: &str, v: Value| echo.insert(k.to_string(), v);
    set("created_at", json!(now()));
    set("model", json!(model));
    set("instructions", json!(instructions));
    set("previous_response_id", json!(previous));
    set("tools", tools_sent.cloned().unwrap_or_else(|| json!([])));
    set(
        "tool_choice",
        choice.cloned().unwrap_or_else(|| json!("auto")),
    );
    set("parallel_tool_calls", json!(parallel.unwrap_or(true)));
    set("temperature", json!(temperature));
    set("top_p", json!(top_p));
    set("max_output_tokens", json!(max_output_tokens));
    set("store", json!(keep));
    set(
        "text",
        text.cloned()
            .unwrap_or_else(|| json!({ "format": { "type": "text" } })),
    );
    set(
        "reasoning",
        json!({ "effort": reasoning.and_then(|r| r.get("effort")).cloned(), "summary": null }),
    );
    set("metadata", metadata.unwrap_or_else(|| json!({})));
    set("truncation", json!(truncation));
    set("user", json!(user));
    set("background", json!(false));
    Ok((
        openai,
        Ask {
            id,
            stream,
            store: keep,
            conversation,
            echo,
            images,
        },
    ))
}

/// `metadata`: an object of strings, echoed in the response.
fn metadata(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(fields)) => match fields.iter().find(|(_, v)| !v.is_string()) {
            None => Ok(Some(Value::Object(fields.clone()))),
            Some((k, v)) => bad(
                "metadata",
                format!("'metadata.{k}' must be a string, not {v}"),
            ),
        },
        Some(other) => bad(
            "metadata",
            format!("'metadata' must be an object of strings, not {other}"),
        ),
    }
}

/// One input item as chat messages: a message turn, an assistant's
/// function call (joining the assistant turn before it), a function's
/// output as a `tool` message; reasoning the client sends back is the
/// model's own earlier reasoning, which chat templates leave out: dropped.
fn turn(name: &str, item: &Value, chat: &mut Vec<Value>) -> Result<(), ApiError> {
    let Value::Object(item) = item else {
        return bad(
            "input",
            format!("'{name}' must be an item object such as {{\"role\": \"user\", \"content\": \"...\"}}, not {item}"),
        );
    };
    let field = |key: &str| match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        other => bad(
            "input",
            format!(
                "'{name}.{key}' must be a string, not {}",
                other.unwrap_or(&Value::Null)
            ),
        ),
    };
    let kind = match item.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(kind)) => Some(kind.as_str()),
        Some(other) => {
            return bad(
                "input",
                format!("'{name}.type' must be a string such as \"message\", not {other}"),
            )
        }
    };
    match kind {
        None | Some("message") if kind.is_some() || item.contains_key("role") => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some(r @ ("user" | "assistant" | "system")) => r,
                Some("developer") => "system",
                _ => {
                    return bad(
                        "input",
                        format!(
                            "'{name}.role' must be \"user\", \"assistant\", \"system\" or \"developer\", not {}",
                            item.get("role").unwrap_or(&Value::Null)
                        ),
                    )
                }
            };
            let content = match role {
                "user" => user_content(name, item.get("content"))?,
                _ => Value::String(content(name, item.get("content"))?),
            };
            chat.push(json!({ "role": role, "content": content }));
        }
        Some("function_call") => {
            let arguments = field("arguments")?;
            if let Err(e) = super::tools::json_arguments(&arguments) {
                return bad(
                    "input",
                    format!("'{name}.arguments' must be a string of JSON, as the answer gave it; it is not JSON ({e})"),
                );
            }
            let call = json!({ "id": field("call_id")?, "type": "function",
                               "function": { "name": field("name")?, "arguments": arguments } });
            match chat.last_mut() {
                Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => last["tool_calls"] = json!([call]),
                },
                _ => chat.push(json!({ "role": "assistant", "content": null, "tool_calls": [call] })),
            }
        }
        Some("function_call_output") => {
            let id = field("call_id")?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(parts @ Value::Array(_)) => content(&format!("{name}.output"), Some(parts))?,
                other => {
                    return bad(
                        "input",
                        format!(
                            "'{name}.output' must be a string or a list of input_text parts, not {}",
                            other.unwrap_or(&Value::Null)
                        ),
                    )
                }
            };
            chat.push(json!({ "role": "tool", "tool_call_id": id, "content": output }));
        }
        Some("reasoning") => {}
        Some(kind) => {
            return bad(
                "input",
                format!("'{name}' is a '{kind}' item; this host serves message, function_call, function_call_output and reasoning items"),
            )
        }
        None => {
            return bad(
                "input",
                format!("'{name}' has neither a 'type' nor a 'role'; a message is {{\"role\": \"user\", \"content\": \"...\"}}"),
            )
        }
    }
    Ok(())
}

/// A user message's content: as [`content`] gives it, or with an
/// `input_image` part, chat's parts in order (`input_image` as `image_url`,
/// checked then like chat's own).
fn user_content(name: &str, value: Option<&Value>) -> Result<Value, ApiError> {
    let Some(Value::Array(parts)) = value else {
        return content(name, value).map(Value::String);
    };
    if !parts
        .iter()
        .any(|p| p.get("type").and_then(Value::as_str) == Some("input_image"))
    {
        return content(name, value).map(Value::String);
    }
    let mut chat = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        if part.get("type").and_then(Value::as_str) != Some("input_image") {
            let text = content(
                &format!("{name}.content[{j}]"),
                Some(&Value::Array(vec![part.clone()])),
            )?;
            chat.push(json!({ "type": "text", "text": text }));
            continue;
        }
        let at = format!("{name}.content[{j}]");
        let mut image = json!({ "url": match part.get("image_url") {
            Some(Value::String(url)) => url.clone(),
            _ if part.get("file_id").is_some() => {
                return bad("input", format!("'{at}.file_id': this host stores no files; send the image as 'image_url', a data: URL (data:image/png;base64,...)"))
            }
            other => return bad("input", format!("'{at}.image_url' must be a data: URL string (data:image/png;base64,...), not {}", other.unwrap_or(&Value::Null))),
        }});
        if let Some(detail) = part.get("detail") {
            image["detail"] = detail.clone();
        }
        let image = json!({ "type": "image_url", "image_url": image });
        if let Err(why) = super::validate::image_part(&image) {
            let why = why.replacen("image_url.url'", "image_url'", 1);
            return bad("input", format!("'{at}.{why}"));
        }
        chat.push(image);
    }
    Ok(Value::Array(chat))
}

/// A message's content as text: a string, or text parts joined by newlines.
fn content(name: &str, value: Option<&Value>) -> Result<String, ApiError> {
    let parts = match value {
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        other => {
            return bad(
                "input",
                format!(
                    "'{name}.content' must be a string or a list of input_text parts, not {}",
                    other.unwrap_or(&Value::Null)
                ),
            )
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{name}.content[{j}]");
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("input_text" | "output_text"), Some(Value::String(text))) => texts.push(text.as_str()),
            (Some("input_text" | "output_text"), other) => {
                return bad("input", format!("'{at}.text' must be a string, not {}", other.unwrap_or(&Value::Null)))
            }
            (Some(kind), _) => {
                return bad("input", format!("'{at}' is an '{kind}' part; this host serves text parts only ({{\"type\": \"input_text\", \"text\": \"...\"}})"))
            }
            (None, _) => {
                return bad("input", format!("'{at}' must be a part object such as {{\"type\": \"input_text\", \"text\": \"...\"}}, not {part}"))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The Responses API's flat function tools (`{"type": "function", "name",
/// "parameters", ...}`) as chat's nested ones; `None` when absent.
fn tools(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let items = match value {
        None => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return bad(
                "tools",
                format!("'tools' must be a list of {{\"type\": \"function\", \"name\", \"parameters\"}} tools, not {other}"),
            )
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let Value::Object(tool) = tool else {
            return bad(
                "tools",
                format!("'tools[{i}]' must be an object, not {tool}"),
            );
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(kind) => {
                return bad(
                    "tools",
                    format!("'tools[{i}]' is a '{kind}' tool, which runs on OpenAI's servers; this host serves function tools ({{\"type\": \"function\", \"name\", \"parameters\"}}) only"),
                )
            }
            None => {
                return bad(
                    "tools",
                    format!("'tools[{i}].type' must be \"function\", not {}", tool.get("type").unwrap_or(&Value::Null)),
                )
            }
        }
        let mut function = Map::new();
        match tool.get("name") {
            Some(Value::String(n)) if !n.is_empty() => function.insert("name".into(), json!(n)),
            other => {
                return bad(
                    "tools",
                    format!(
                        "'tools[{i}].name' must be a non-empty string, not {}",
                        other.unwrap_or(&Value::Null)
                    ),
                )
            }
        };
        match tool.get("parameters") {
            None | Some(Value::Null) => function.insert(
                "parameters".into(),
                json!({ "type": "object", "properties": {} }),
            ),
            Some(schema @ Value::Object(_)) => function.insert("parameters".into(), schema.clone()),
            Some(other) => {
                return bad(
                    "tools",
                    format!("'tools[{i}].parameters' must be a JSON Schema object, not {other}"),
                )
            }
        };
        match tool.get("description") {
            None | Some(Value::Null) => {}
            Some(d @ Value::String(_)) => {
                function.insert("description".into(), d.clone());
            }
            Some(other) => {
                return bad(
                    "tools",
                    format!("'tools[{i}].description' must be a string, not {other}"),
                )
            }
        }
        match tool.get("strict") {
            None | Some(Value::Null) => {}
            Some(s @ Value::Bool(_)) => {
                function.insert("strict".into(), s.clone());
            }
            Some(other) => {
                return bad(
                    "tools",
                    format!("'tools[{i}].strict' must be true or false, not {other}"),
                )
            }
        }
        out.push(json!({ "type": "function", "function": function }));
    }
    Ok(Some(Value::Array(out)))
}

/// `tool_choice`: `auto`, `none`, `required`, or
/// `{"type": "function", "name"}`, as chat's.
fn tool_choice(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match value {
        None => Ok(None),
        Some(Value::String(mode)) if ["auto", "none", "required"].contains(&mode.as_str()) => {
            Ok(Some(json!(mode)))
        }
        Some(Value::Object(choice)) if choice.get("type").and_then(Value::as_str) == Some("function") => {
            match choice.get("name") {
                Some(Value::String(name)) if !name.is_empty() => {
                    Ok(Some(json!({ "type": "function", "function": { "name": name } })))
                }
                other => bad(
                    "tool_choice",
                    format!("'tool_choice.name' must be the function's name, not {}", other.unwrap_or(&Value::Null)),
                ),
            }
        }
        Some(other) => bad(
            "tool_choice",
            format!("'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": \"...\"}}, not {other}"),
        ),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn text_format(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Value::Object(text) = value else {
        return bad("text", format!("'text' must be an object such as {{\"format\": {{\"type\": \"text\"}}}}, not {value}"));
    };
    if let Some(key) = text
        .keys()
        .find(|k| !["format", "verbosity"].contains(&k.as_str()))
    {
        return bad(
            "text",
            format!("'text.{key}' is not supported by this host (it serves: format, verbosity)"),
        );
    }
    match text.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if ["low", "medium", "high"].contains(&v.as_str()) => {}
        Some(other) => {
            return bad(
                "text",
                format!("'text.verbosity' must be \"low\", \"medium\" or \"high\", not {other}"),
            )
        }
    }
    let format = match text.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(format)) => format,
        Some(other) => return bad("text", format!("'text.format' must be an object such as {{\"type\": \"json_object\"}}, not {other}")),
    };
    // The optional fields are checked whatever the type, as the document's
    // schema has them.
    let optional = [
        ("name", "a string", Value::is_string as fn(&Value) -> bool),
        ("schema", "a JSON Schema object", Value::is_object),
        ("strict", "true or false", Value::is_boolean),
        ("description", "a string", Value::is_string),
    ];
    for (key, what, ok) in optional {
        match format.get(key) {
            Some(v) if !v.is_null() && !ok(v) => {
                return bad(
                    "text",
                    format!("'text.format.{key}' must be {what}, not {v}"),
                )
            }
            _ => {}
        }
    }
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "json_object" }))),
        Some("json_schema") => {
            let mut schema = Map::new();
            match format.get("name") {
                Some(Value::String(n)) if !n.is_empty() => schema.insert("name".into(), json!(n)),
                other => {
                    return bad(
                        "text",
                        format!(
                            "'text.format.name' must be a non-empty string, not {}",
                            other.unwrap_or(&Value::Null)
                        ),
                    )
                }
            };
            match format.get("schema") {
                Some(s @ Value::Object(_)) => schema.insert("schema".into(), s.clone()),
                other => {
                    return bad(
                        "text",
                        format!(
                            "'text.format.schema' must be a JSON Schema object, not {}",
                            other.unwrap_or(&Value::Null)
                        ),
                    )
                }
            };
            for key in ["strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(
                json!({ "type": "json_schema", "json_schema": schema }),
            ))
        }
        _ => bad(
            "text",
            format!(
                "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\", not {}",
                format.get("type").unwrap_or(&Value::Null)
            ),
        ),
    }
}

/// `reasoning.effort`, as chat's `reasoning_effort` (`summary` is
/// accepted and ignored: no engine here summarises its reasoning).
fn effort(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Value::Object(reasoning) = value else {
        return bad(
            "reasoning",
            format!("'reasoning' must be an object such as {{\"effort\": \"low\"}}, not {value}"),
        );
    };
    if let Some(key) = reasoning
        .keys()
        .find(|k| !["effort", "summary", "generate_summary"].contains(&k.as_str()))
    {
        return bad(
            "reasoning",
            format!("'reasoning.{key}' is not supported by this host (it serves: effort, summary)"),
        );
    }
    for key in ["summary", "generate_summary"] {
        match reasoning.get(key) {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(other) => {
                return bad(
                    "reasoning",
                    format!("'reasoning.{key}' must be a string such as \"auto\", not {other}"),
                )
            }
        }
    }
    let efforts = crate::settings::REASONING_EFFORTS;
    match reasoning.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if efforts.contains(&e.as_str()) => Ok(Some(e.clone())),
        Some(other) => bad(
            "reasoning",
            format!(
                "'reasoning.effort' must be one of {}, not {other}",
                efforts.join(", ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
