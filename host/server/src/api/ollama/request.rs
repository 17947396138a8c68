//! Ollama's requests, validated field by field and translated to OpenAI's:
//! `/api/chat` and `/api/generate` to a streamed chat request (a `raw`
//! generate to a completion), `options` to OpenAI's sampling fields,
//! `format` to `response_format`, `keep_alive` to a [`KeepAlive`].

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::super::{validate, ApiError};

/// Which of Ollama's routes asked, for the answer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Generate,
}

/// A translated request, and what the answer needs of it.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) kind: Kind,
    /// The model as the client named it (answers carry it back).
    pub(super) name: String,
    /// Ollama streams unless told `"stream": false`.
    pub(super) stream: bool,
    /// Whether the model's reasoning is passed on (`think`, default yes).
    pub(super) think: bool,
    pub(super) keep_alive: Option<KeepAlive>,
    /// The OpenAI request; `None` when there is nothing to generate (the
    /// model is loaded, or unloaded).
    pub(super) openai: Option<Map<String, Value>>,
    /// The engine route it goes to.
    pub(super) path: &'static str,
}

/// How long a model stays loaded once idle, from `keep_alive`: a duration
/// (`"5m"`, `"1h30m"`, `"300ms"`) or a number of seconds. The scheduler
/// holds it for the model's requests from then on, in place of the
/// model's `ttl_seconds`; a request without one goes back to those.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum KeepAlive {
    /// `0`: unloaded once this answer is sent.
    Unload,
    /// Negative: kept loaded (no idle unload).
    Forever,
    /// Unloaded after this long idle.
    For(Duration),
}

/// The fields of `/api/chat` this host serves; any other is refused by name.
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
];

/// The fields of `/api/generate` this host serves.
const GENERATE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "suffix",
    "system",
    "template",
    "context",
    "raw",
    "format",
    "images",
    "options",
    "stream",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
    "width",
    "height",
    "steps",
];

/// Fields Ollama defines that this host takes only when unset (`false`,
/// `0`): log probabilities, and image generation's sizes.
const UNSERVED: &[&str] = &["logprobs", "top_logprobs", "width", "height", "steps"];

/// Ollama's `options` Hangar maps, and the OpenAI field each becomes.
const OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("num_predict", "max_tokens"),
    ("stop", "stop"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
];

/// Ollama's `options` that Hangar takes and ignores: llama.cpp's loading
/// and threading knobs (`num_ctx`, `num_batch`, `num_gpu`, `main_gpu`,
/// `num_thread`, `use_mmap`, `use_mlock`, `numa`, `low_vram`, `vocab_only`,
/// `f16_kv`, `logits_all`: Hangar sets loading per model, in its settings,
/// not per request), and samplers the OpenAI path has no field for
/// (`repeat_penalty`, `repeat_last_n`, `penalize_newline`, `num_keep`,
/// `tfs_z`, `typical_p`, `mirostat`, `mirostat_tau`, `mirostat_eta`). Keys
/// Ollama does not define are refused.
const IGNORED: &[&str] = &[
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "repeat_penalty",
    "repeat_last_n",
    "penalize_newline",
    "num_keep",
    "tfs_z",
    "typical_p",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
];

fn bad(message: String, field: &'static str) -> ApiError {
    ApiError::bad_request(message, Some(field))
}

/// The body as a JSON object with only `fields`, none of them set to
/// what this host does not serve.
fn object(body: &[u8], fields: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let request = validate::object_of(body, fields)?;
    let set = |v: &Value| !(v.is_null() || v == &json!(false) || v == &json!(0));
    if let Some(name) = UNSERVED.iter().find(|n| request.get(**n).is_some_and(set)) {
        return Err(ApiError::bad_request(
            format!("'{name}' is not supported by this host: it serves text generation without log probabilities"),
            Some(*name),
        ));
    }
    Ok(request)
}

/// `model` (or Ollama's older `name`).
fn model(request: &Map<String, Value>) -> Result<String, ApiError> {
    match request.get("model").or_else(|| request.get("name")) {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        _ => Err(bad(
            "'model' is required: a string naming one of the models GET /api/tags lists".into(),
            "model",
        )),
    }
}

/// A `true`/`false` field, `default` when absent.
fn flag(request: &Map<String, Value>, name: &'static str, default: bool) -> Result<bool, ApiError> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(
            format!("'{name}' must be true or false, not {other}"),
            name,
        )),
    }
}

/// `think`: true or false, or a level (`"low"`, `"medium"`, `"high"`),
/// which passes reasoning on as `true` does (the engine's template decides
/// how much it thinks).
fn think(request: &Map<String, Value>) -> Result<bool, ApiError> {
    match request.get("think") {
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            Ok(true)
        }
        Some(Value::String(other)) => Err(bad(
            format!(
                "'think' must be true, false, \"low\", \"medium\" or \"high\", not \"{other}\""
            ),
            "think",
        )),
        _ => flag(request, "think", true),
    }
}

/// Fields every generating request shares: options, format, stream.
fn common(request: &Map<String, Value>, openai: &mut Map<String, Value>) -> Result<(), ApiError> {
    openai.extend(options(request.get("options"))?);
    if let Some(format) = format(request.get("format"))? {
        openai.insert("response_format".into(), format);
    }
    openai.insert("stream".into(), json!(true));
    openai.insert("stream_options".into(), json!({ "include_usage": true }));
    Ok(())
}

/// `POST /api/chat`.
pub(super) fn chat(body: &[u8]) -> Result<Ask, ApiError> {
    let request = object(body, CHAT_FIELDS)?;
    let name = model(&request)?;
    let keep_alive = keep_alive(request.get("keep_alive"))?;
    let stream = flag(&request, "stream", true)?;
    let think = think(&request)?;
    let turns: &[Value] = match request.get("messages") {
        None | Some(Value::Null) => &[],
        Some(Value::Array(turns)) => turns,
        Some(other) => {
            return Err(bad(
                format!(
                    "'messages' must be a list of {{\"role\", \"content\"}} messages, not {other}"
                ),
                "messages",
            ))
        }
    };
    let mut openai = Map::new();
    openai.insert("messages".into(), Value::Array(messages(turns)?));
    if let Some(tools) = tools(request.get("tools"))? {
        openai.insert("tools".into(), tools);
    }
    common(&request, &mut openai)?;
    Ok(Ask {
        kind: Kind::Chat,
        name,
        stream,
        think,
        keep_alive,
        // No messages: Ollama loads the model (or unloads it).
        openai: (!turns.is_empty()).then_some(openai),
        path: "/v1/chat/completions",
    })
}

/// Ollama's messages as OpenAI's: `tool_calls` get ids, which the `tool`
/// messages after them answer in order (or by `tool_name`); an assistant's
/// `thinking` is its own earlier reasoning, which chat templates leave out.
fn messages(turns: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(turns.len());
    // The calls not yet answered: (id, tool name).
    let mut pending: std::collections::VecDeque<(String, String)> = Default::default();
    for (i, turn) in turns.iter().enumerate() {
        let fail = |what: String| Err(bad(what, "messages"));
        let Value::Object(turn) = turn else {
            return fail(format!(
                "'messages[{i}]' must be an object with 'role' and 'content', not {turn}"
            ));
        };
        let role = match turn.get("role") {
            Some(Value::String(r)) if ["system", "user", "assistant", "tool"].contains(&r.as_str()) => r.as_str(),
            other => {
                return fail(format!(
                    "'messages[{i}].role' must be \"system\", \"user\", \"assistant\" or \"tool\", not {}",
                    other.unwrap_or(&Value::Null)
                ))
            }
        };
        let content = match turn.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(c)) => c.as_str(),
            Some(other) => {
                return fail(format!(
                    "'messages[{i}].content' must be a string, not {other}"
                ))
            }
        };
        for (key, value) in turn {
            match (key.as_str(), value) {
                ("role" | "content" | "tool_calls", _) | ("tool_name", Value::String(_)) | (_, Value::Null) => {}
                ("tool_name", other) => {
                    return fail(format!("'messages[{i}].tool_name' must be a string, not {other}"))
                }
                ("images", Value::Array(_)) if role == "user" => {}
                ("images", other) => {
                    return fail(format!(
                        "'messages[{i}].images' must be a list of base64 images in a user message, not {other}"
                    ))
                }
                ("thinking", Value::String(_)) if role == "assistant" => {}
                (other, _) => {
                    return fail(format!(
                        "'messages[{i}].{other}' is not supported by this host (a message has role, content, tool_calls, tool_name, thinking, images)"
                    ))
                }
            }
        }
        let images = image_parts(turn.get("images"), &format!("messages[{i}].images"))
            .map_err(|why| bad(why, "messages"))?;
        let mut message = match images {
            Some(mut parts) => {
                parts.insert(0, json!({ "type": "text", "text": content }));
                json!({ "role": role, "content": parts })
            }
            None => json!({ "role": role, "content": content }),
        };
        match (role, turn.get("tool_calls")) {
            (_, None | Some(Value::Null)) => {}
            ("assistant", Some(Value::Array(calls))) => {
                let mut openai = Vec::with_capacity(calls.len());
                for (j, call) in calls.iter().enumerate() {
                    let function = call.get("function");
                    let Some(tool) = function.and_then(|f| f.get("name")).and_then(Value::as_str) else {
                        return fail(format!("'messages[{i}].tool_calls[{j}].function.name' must be a string"));
                    };
                    let arguments = match function.and_then(|f| f.get("arguments")) {
                        None | Some(Value::Null) => "{}".to_string(),
                        Some(args @ Value::Object(_)) => args.to_string(),
                        Some(other) => {
                            return fail(format!(
                                "'messages[{i}].tool_calls[{j}].function.arguments' must be an object, not {other}"
                            ))
                        }
                    };
                    let id = format!("call_{i}_{j}");
                    pending.push_back((id.clone(), tool.to_string()));
                    openai.push(json!({ "id": id, "type": "function",
                                        "function": { "name": tool, "arguments": arguments } }));
                }
                message["tool_calls"] = Value::Array(openai);
            }
            (_, Some(other)) => {
                return fail(format!(
                    "'messages[{i}].tool_calls' must be a list of calls on an assistant message, not {other}"
                ))
            }
        }
        if role == "tool" {
            let named = turn.get("tool_name").and_then(Value::as_str);
            let at = named
                .and_then(|n| pending.iter().position(|(_, tool)| tool == n))
                .unwrap_or(0);
            let id = match pending.remove(at) {
                Some((id, _)) => id,
                None => format!("call_{i}"),
            };
            message["tool_call_id"] = json!(id);
        }
        out.push(message);
    }
    Ok(out)
}

/// `tools`: OpenAI's function tools already; each must be one.
fn tools(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) if items.is_empty() => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(bad(
                format!("'tools' must be a list of function tools, not {other}"),
                "tools",
            ))
        }
    };
    for (i, tool) in items.iter().enumerate() {
        let named = tool
            .pointer("/function/name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let kind = tool.get("type").is_none_or(|t| t == "function");
        if !named || !kind {
            return Err(bad(
                format!("'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\", \"description\", \"parameters\"}}}}, not {tool}"),
                "tools",
            ));
        }
    }
    Ok(Some(Value::Array(items.clone())))
}

/// `POST /api/generate`: a prompt (with `system`) as a chat request, or
/// with `raw` as a completion of the prompt as written.
pub(super) fn generate(body: &[u8]) -> Result<Ask, ApiError> {
    let request = object(body, GENERATE_FIELDS)?;
    let name = model(&request)?;
    let keep_alive = keep_alive(request.get("keep_alive"))?;
    let stream = flag(&request, "stream", true)?;
    let raw = flag(&request, "raw", false)?;
    let think = think(&request)?;
    let text = |field: &'static str| match request.get(field) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(other) => Err(bad(
            format!("'{field}' must be a string, not {other}"),
            field,
        )),
    };
    let (prompt, system) = (text("prompt")?, text("system")?);
    if !text("suffix")?.is_empty() {
        return Err(bad(
            "'suffix' (fill in the middle) is not supported by this host; send the text before the gap as 'prompt'".into(),
            "suffix",
        ));
    }
    if !text("template")?.is_empty() {
        return Err(bad(
            "'template' is not supported: the model's own chat template is used; send a formatted prompt with \"raw\": true instead".into(),
            "template",
        ));
    }
    let filled = |field: &str| match request.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    };
    let images = image_parts(request.get("images"), "images").map_err(|why| bad(why, "images"))?;
    if images.is_some() && raw {
        return Err(bad(
            "'images' needs \"raw\": false (images go through the model's chat template)".into(),
            "images",
        ));
    }
    if filled("context") {
        return Err(bad(
            "'context' (the token context of an earlier answer) is not supported; send the conversation to /api/chat instead".into(),
            "context",
        ));
    }
    let mut openai = Map::new();
    let path = match raw {
        true => {
            if !request.get("format").is_none_or(|f| f.is_null() || f == "") {
                return Err(bad(
                    "'format' needs \"raw\": false (structured output goes through the model's chat template)".into(),
                    "format",
                ));
            }
            openai.insert("prompt".into(), json!(prompt));
            "/v1/completions"
        }
        false => {
            let mut turns = Vec::new();
            if !system.is_empty() {
                turns.push(json!({ "role": "system", "content": system }));
            }
            turns.push(match images {
                Some(mut parts) => {
                    parts.insert(0, json!({ "type": "text", "text": prompt }));
                    json!({ "role": "user", "content": parts })
                }
                None => json!({ "role": "user", "content": prompt }),
            });
            openai.insert("messages".into(), Value::Array(turns));
            "/v1/chat/completions"
        }
    };
    common(&request, &mut openai)?;
    Ok(Ask {
        kind: Kind::Generate,
        name,
        stream,
        think,
        keep_alive,
        // No prompt: Ollama loads the model (or unloads it).
        openai: (!prompt.is_empty()).then_some(openai),
        path,
    })
}

/// Ollama's `images` (base64 strings, no type given) as OpenAI `image_url`
/// parts with `data:` URLs, the type read from each image's first bytes;
/// `None` when there are none. On error: what is wrong, naming `field`.
fn image_parts(value: Option<&Value>, field: &str) -> Result<Option<Vec<Value>>, String> {
    use base64::Engine;
    let images = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(images)) if images.is_empty() => return Ok(None),
        Some(Value::Array(images)) => images,
        Some(other) => {
            return Err(format!(
                "'{field}' must be a list of base64 images, not {other}"
            ))
        }
    };
    let mut parts = Vec::with_capacity(images.len());
    for (k, image) in images.iter().enumerate() {
        let Value::String(data) = image else {
            return Err(format!(
                "'{field}[{k}]' must be a base64 string, not {image}"
            ));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("'{field}[{k}]' is not valid base64: {e}"))?;
        let kind = super::super::images::image_type(&bytes)
            .ok_or_else(|| format!("'{field}[{k}]' is not a PNG, JPEG, GIF, WebP or BMP image"))?;
        parts.push(json!({ "type": "image_url",
                           "image_url": { "url": format!("data:image/{kind};base64,{data}") } }));
    }
    Ok(Some(parts))
}

/// `POST /api/show`: the model's name.
pub(super) fn show(body: &[u8]) -> Result<String, ApiError> {
    model(&object(body, &["model", "name", "verbose"])?)
}

/// `DELETE /api/delete`: the model's name.
pub(super) fn delete(body: &[u8]) -> Result<String, ApiError> {
    model(&object(body, &["model", "name"])?)
}

/// `options` as OpenAI's fields, each checked by the OpenAI route's rule
/// and refused under its Ollama name.
pub(super) fn options(value: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    let options = match value {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(options)) => options,
        Some(other) => {
            return Err(bad(
                format!(
                    "'options' must be an object such as {{\"temperature\": 0.7}}, not {other}"
                ),
                "options",
            ))
        }
    };
    for (key, value) in options {
        if value.is_null() || IGNORED.contains(&key.as_str()) {
            continue;
        }
        let Some(&(_, field)) = OPTIONS.iter().find(|(k, _)| k == key) else {
            let mapped: Vec<&str> = OPTIONS.iter().map(|(k, _)| *k).collect();
            return Err(bad(
                format!(
                    "'options.{key}' is not an option Ollama defines (this host maps {}, and takes and ignores {})",
                    mapped.join(", "),
                    IGNORED.join(", ")
                ),
                "options",
            ));
        };
        let checked = match field {
            // Ollama's -1 (no limit) and -2 (fill the context): no max_tokens.
            "max_tokens" if value.as_i64().is_some_and(|n| n == -1 || n == -2) => continue,
            "max_tokens" | "top_k" => {
                validate::count(Some(value), field).map(|n| n.map(Value::from))
            }
            "seed" => validate::seed(Some(value)).map(|n| n.map(Value::from)),
            "stop" if !value.is_array() => Err(ApiError::bad_request(
                format!("'stop' must be a list of strings, not {value}"),
                Some("stop"),
            )),
            "stop" => validate::stop(Some(value)).map(|s| Some(json!(s))),
            _ => validate::number(Some(value), field).map(|n| n.map(Value::from)),
        };
        match checked {
            Ok(Some(v)) => {
                out.insert(field.into(), v);
            }
            Ok(None) => {}
            Err(mut e) => {
                e.message =
                    e.message
                        .replacen(&format!("'{field}'"), &format!("'options.{key}'"), 1);
                e.param = Some("options".into());
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// `format`: `"json"` (any JSON object) or a JSON schema, as OpenAI's
/// `response_format`; the structured-output path enforces it, or refuses
/// an engine without the capability.
pub(super) fn format(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(json!({ "type": "json_object" }))),
        Some(schema @ Value::Object(_)) => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": { "name": "format", "schema": schema },
        }))),
        Some(other) => Err(bad(
            format!("'format' must be \"json\" or a JSON schema object, not {other}"),
            "format",
        )),
    }
}

/// `keep_alive`: a duration (`"5m"`, `"1h30m"`, `"0"`, `"-1"`) or seconds.
pub(crate) fn keep_alive(value: Option<&Value>) -> Result<Option<KeepAlive>, ApiError> {
    let seconds = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) if s.trim().is_empty() => return Ok(None),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok().or_else(|| duration(s.trim())),
        Some(_) => None,
    };
    match seconds {
        Some(s) if !s.is_finite() => {}
        Some(s) if s < 0.0 => return Ok(Some(KeepAlive::Forever)),
        Some(0.0) => return Ok(Some(KeepAlive::Unload)),
        Some(s) => return Ok(Some(KeepAlive::For(Duration::from_secs_f64(s.min(1e12))))),
        None => {}
    }
    Err(bad(
        format!(
            "'keep_alive' must be a duration such as \"5m\", \"1h30m\" or \"300ms\", a number of seconds, 0 (unload after this answer) or negative (keep loaded), not {}",
            value.unwrap_or(&Value::Null)
        ),
        "keep_alive",
    ))
}

/// A Go duration (`"1h30m"`, `"-1.5s"`, `"300ms"`) in seconds.
fn duration(text: &str) -> Option<f64> {
    let (sign, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, text.strip_prefix('+').unwrap_or(text)),
    };
    let mut total = 0.0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit..];
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    /// A request's translation, or its refusal.
    fn check(route: Kind, request: Value, expect: Expect) {
        let body = request.to_string();
        let ask = match route {
            Kind::Chat => chat(body.as_bytes()),
            Kind::Generate => generate(body.as_bytes()),
        };
        let got = match ask {
            Ok(ask) => format!(
                "{} {} stream={} think={} keep_alive={:?}",
                ask.path,
                ask.openai
                    .map_or("-".to_string(), |o| Value::Object(o).to_string()),
                ask.stream,
                ask.think,
                ask.keep_alive
            ),
            Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
        };
        expect.assert_eq(&got);
    }

    #[test]
    fn a_chat_becomes_a_streamed_chat_request() {
        check(
            Kind::Chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "options": {"temperature": 0.5, "num_predict": 8, "stop": ["x"], "seed": 3, "num_ctx": 4096},
                   "format": "json", "keep_alive": "5m", "stream": false}),
            expect![[
                r#"/v1/chat/completions {"max_tokens":8,"messages":[{"content":"hi","role":"user"}],"response_format":{"type":"json_object"},"seed":3,"stop":["x"],"stream":true,"stream_options":{"include_usage":true},"temperature":0.5} stream=false think=true keep_alive=Some(For(300s))"#
            ]],
        );
        check(
            Kind::Chat,
            json!({"model": "m", "think": false, "keep_alive": 0,
                   "format": {"type": "object"},
                   "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
                   "messages": [
                       {"role": "user", "content": "add"},
                       {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1}}}]},
                       {"role": "tool", "content": "1", "tool_name": "add"}]}),
            expect![[
                r#"/v1/chat/completions {"messages":[{"content":"add","role":"user"},{"content":"","role":"assistant","tool_calls":[{"function":{"arguments":"{\"a\":1}","name":"add"},"id":"call_1_0","type":"function"}]},{"content":"1","role":"tool","tool_call_id":"call_1_0"}],"response_format":{"json_schema":{"name":"format","schema":{"type":"object"}},"type":"json_schema"},"stream":true,"stream_options":{"include_usage":true},"tools":[{"function":{"name":"add","parameters":{"type":"object"}},"type":"function"}]} stream=true think=false keep_alive=Some(Unload)"#
            ]],
        );
        // No messages: a load.
        check(
            Kind::Chat,
            json!({"model": "m", "messages": []}),
            expect!["/v1/chat/completions - stream=true think=true keep_alive=None"],
        );
    }

    #[test]
    fn a_generate_becomes_a_chat_or_a_raw_completion() {
        check(
            Kind::Generate,
            json!({"model": "m", "prompt": "hi", "system": "be brief", "options": {"top_k": 5, "num_predict": -1}}),
            expect![[
                r#"/v1/chat/completions {"messages":[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}],"stream":true,"stream_options":{"include_usage":true},"top_k":5} stream=true think=true keep_alive=None"#
            ]],
        );
        check(
            Kind::Generate,
            json!({"model": "m", "prompt": "hi", "raw": true, "images": [], "keep_alive": -1}),
            expect![[
                r#"/v1/completions {"prompt":"hi","stream":true,"stream_options":{"include_usage":true}} stream=true think=true keep_alive=Some(Forever)"#
            ]],
        );
        check(
            Kind::Generate,
            json!({"model": "m", "keep_alive": "0"}),
            expect!["/v1/chat/completions - stream=true think=true keep_alive=Some(Unload)"],
        );
    }

    #[test]
    fn every_field_is_checked_by_name() {
        let cases = [
            (
                Kind::Chat,
                json!({"messages": []}),
                expect![[
                    r#"400 Some("model"): 'model' is required: a string naming one of the models GET /api/tags lists"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": "hi"}),
                expect![[
                    r#"400 Some("messages"): 'messages' must be a list of {"role", "content"} messages, not "hi""#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
                expect![[
                    r#"400 Some("messages"): 'messages[0].images[0]' is not a PNG, JPEG, GIF, WebP or BMP image"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["iVBORw=="]}]}),
                expect![[
                    r#"/v1/chat/completions {"messages":[{"content":[{"text":"x","type":"text"},{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"}],"stream":true,"stream_options":{"include_usage":true}} stream=true think=true keep_alive=None"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "assistant", "content": "x", "images": ["iVBORw=="]}]}),
                expect![[
                    r#"400 Some("messages"): 'messages[0].images' must be a list of base64 images in a user message, not ["iVBORw=="]"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                expect![[
                    r#"400 Some("messages"): 'messages[0].role' must be "system", "user", "assistant" or "tool", not "robot""#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [], "options": {"temperature": 3}}),
                expect![[
                    r#"400 Some("options"): 'options.temperature' must be a number from 0 to 2, not 3"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 0}}),
                expect![[
                    r#"400 Some("options"): 'options.num_predict' must be a whole number from 1 to 4294967295, not 0"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "options": {"warmth": 1}}),
                expect![[
                    r#"400 Some("options"): 'options.warmth' is not an option Ollama defines (this host maps temperature, top_p, top_k, min_p, seed, num_predict, stop, presence_penalty, frequency_penalty, and takes and ignores num_ctx, num_batch, num_gpu, main_gpu, num_thread, use_mmap, use_mlock, numa, low_vram, vocab_only, f16_kv, logits_all, repeat_penalty, repeat_last_n, penalize_newline, num_keep, tfs_z, typical_p, mirostat, mirostat_tau, mirostat_eta)"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": "yaml"}),
                expect![[
                    r#"400 Some("format"): 'format' must be "json" or a JSON schema object, not "yaml""#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [], "keep_alive": "5 minutes"}),
                expect![[
                    r#"400 Some("keep_alive"): 'keep_alive' must be a duration such as "5m", "1h30m" or "300ms", a number of seconds, 0 (unload after this answer) or negative (keep loaded), not "5 minutes""#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [], "stream": "yes"}),
                expect![[r#"400 Some("stream"): 'stream' must be true or false, not "yes""#]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [], "truncate": true}),
                expect![[
                    r#"400 Some("truncate"): 'truncate' is not supported by this host (it serves: model, messages, tools, format, options, stream, keep_alive, think, logprobs, top_logprobs)"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": "a", "suffix": "b"}),
                expect![[
                    r#"400 Some("suffix"): 'suffix' (fill in the middle) is not supported by this host; send the text before the gap as 'prompt'"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": "a", "images": ["aGk="]}),
                expect![[
                    r#"400 Some("images"): 'images[0]' is not a PNG, JPEG, GIF, WebP or BMP image"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": "a", "images": ["/9j/4A=="]}),
                expect![[
                    r#"/v1/chat/completions {"messages":[{"content":[{"text":"a","type":"text"},{"image_url":{"url":"data:image/jpeg;base64,/9j/4A=="},"type":"image_url"}],"role":"user"}],"stream":true,"stream_options":{"include_usage":true}} stream=true think=true keep_alive=None"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": "a", "raw": true, "images": ["/9j/4A=="]}),
                expect![[
                    r#"400 Some("images"): 'images' needs "raw": false (images go through the model's chat template)"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": "a", "raw": true, "format": "json"}),
                expect![[
                    r#"400 Some("format"): 'format' needs "raw": false (structured output goes through the model's chat template)"#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [], "options": {"stop": "x"}}),
                expect![[
                    r#"400 Some("options"): 'options.stop' must be a list of strings, not "x""#
                ]],
            ),
            (
                Kind::Chat,
                json!({"model": "m", "messages": [{"role": "tool", "content": "1", "tool_name": 5}]}),
                expect![[
                    r#"400 Some("messages"): 'messages[0].tool_name' must be a string, not 5"#
                ]],
            ),
            (
                Kind::Generate,
                json!({"model": "m", "prompt": 5}),
                expect![[r#"400 Some("prompt"): 'prompt' must be a string, not 5"#]],
            ),
        ];
        for (kind, request, expect) in cases {
            check(kind, request, expect);
        }
    }

    #[test]
    fn keep_alive_reads_durations_and_seconds() {
        let read = |v: Value| match keep_alive(Some(&v)) {
            Ok(k) => format!("{k:?}"),
            Err(e) => format!("error ({:?})", e.param),
        };
        let got: Vec<String> = [
            json!("5m"),
            json!("1h30m"),
            json!("300ms"),
            json!("1.5s"),
            json!("0"),
            json!("0s"),
            json!(0),
            json!("-1"),
            json!(-1),
            json!("-1m"),
            json!(600),
            json!("600"),
            json!(""),
            json!("5x"),
            json!("m"),
            json!(true),
        ]
        .into_iter()
        .map(read)
        .collect();
        expect![[r#"
            Some(For(300s))
            Some(For(5400s))
            Some(For(300ms))
            Some(For(1.5s))
            Some(Unload)
            Some(Unload)
            Some(Unload)
            Some(Forever)
            Some(Forever)
            Some(Forever)
            Some(For(600s))
            Some(For(600s))
            None
            error (Some("keep_alive"))
            error (Some("keep_alive"))
            error (Some("keep_alive"))"#]]
        .assert_eq(&got.join("\n"));
    }
}
