//! Request validation at the edge: every OpenAI field Hangar knows is
//! checked for type and range before any engine sees the request, and a
//! bad one is a 400 naming the field. Nothing is coerced: a `max_tokens`
//! of 1e300, 2^64, -5 or 2.5 is refused rather than cast into something an
//! engine would accept (1e300 as `u32` asks for four billion tokens), and a
//! `"stop": 5` never reaches an engine whose generation thread it would
//! kill.
//!
//! The same readers give the in-process path its typed values, so that the
//! rules are written once.

use serde_json::{Map, Value};

use super::inprocess::Route;
use super::ApiError;

/// What a known field must hold.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A whole number in `min..=max`.
    Count { min: u64, max: u64 },
    /// Any number in `min..=max`.
    Number { min: f64, max: f64 },
    /// A whole number that fits 64 bits, signed or not.
    Seed,
    /// `true` or `false`.
    Bool,
    /// A string or a list of strings.
    Stop,
    /// `{"include_usage": bool}`.
    StreamOptions,
}

/// The fields both completion routes share. `n` is capped: each choice is a
/// whole generation, and no engine here serves more than a handful at once.
const FIELDS: &[(&str, Rule)] = &[
    ("max_tokens", COUNT_TOKENS),
    ("max_completion_tokens", COUNT_TOKENS),
    (
        "top_k",
        Rule::Count {
            min: 0,
            max: u32::MAX as u64,
        },
    ),
    ("n", Rule::Count { min: 1, max: 128 }),
    ("temperature", Rule::Number { min: 0.0, max: 2.0 }),
    ("top_p", Rule::Number { min: 0.0, max: 1.0 }),
    ("min_p", Rule::Number { min: 0.0, max: 1.0 }),
    (
        "presence_penalty",
        Rule::Number {
            min: -2.0,
            max: 2.0,
        },
    ),
    (
        "frequency_penalty",
        Rule::Number {
            min: -2.0,
            max: 2.0,
        },
    ),
    ("seed", Rule::Seed),
    ("stream", Rule::Bool),
    ("stop", Rule::Stop),
    ("stream_options", Rule::StreamOptions),
];

const COUNT_TOKENS: Rule = Rule::Count {
    min: 1,
    max: u32::MAX as u64,
};

/// Checks every known field of a request to `route`; unknown fields pass
/// through for the engine to judge.
pub(crate) fn check(route: Route, request: &Map<String, Value>) -> Result<(), ApiError> {
    match route {
        Route::Chat => {
            messages(request.get("messages"))?;
            super::tools::read(request)?;
            prediction(request.get("prediction"))?;
        }
        Route::Completion => prompt(request.get("prompt"))?,
    }
    for (name, rule) in FIELDS {
        if let Some(value) = present(request, name) {
            apply(name, *rule, value)?;
        }
    }
    Ok(())
}

/// Refuses a `top_k` as large as the model's vocabulary or larger (`vocab_size` in its
/// `config.json`, for models that have one): mlx-lm's generation thread dies
/// on it (found by schemathesis), and no answer would differ from `0`, off.
pub(crate) fn top_k_within_vocabulary(
    model: &hangar_engine::models::Model,
    request: &Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(k) = request
        .get("top_k")
        .and_then(Value::as_u64)
        .filter(|k| *k > 0)
    else {
        return Ok(());
    };
    let Ok(text) = std::fs::read(model.path.join("config.json")) else {
        return Ok(()); // a single-file model, or a folder without one
    };
    let config: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
    let vocabulary = config
        .get("vocab_size")
        .or_else(|| config.pointer("/text_config/vocab_size"))
        .and_then(Value::as_u64);
    match vocabulary {
        // Keeping all `v` tokens is no top-k at all, and kills mlx-lm too.
        Some(v) if k >= v => Err(ApiError::bad_request(
            format!(
                "'top_k' is {k}, not less than the {v} tokens of model '{}'; use at most {}, or 0 for no top-k",
                model.id,
                v - 1
            ),
            Some("top_k"),
        )),
        _ => Ok(()),
    }
}

/// A request body as a JSON object holding only `fields`; any other is
/// refused by name (the translated routes, which know every field they
/// serve).
pub(crate) fn object_of(body: &[u8], fields: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let request: Map<String, Value> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not a JSON object: {e}"), None)
    })?;
    if let Some(name) = request.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::unknown_field(
            name,
            format!(
                "'{name}' is not supported by this host (it serves: {})",
                fields.join(", ")
            ),
        ));
    }
    Ok(request)
}

/// A token count (`max_tokens`, `top_k`), or `None` when absent.
pub(crate) fn count(value: Option<&Value>, name: &'static str) -> Result<Option<u32>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let rule = rule_of(name);
    apply(name, rule, value)?;
    // `apply` accepted a whole number within u32.
    Ok(value.as_u64().and_then(|n| u32::try_from(n).ok()))
}

/// A token count under a route's own name for it (`max_output_tokens`):
/// a whole number from 1, or `None` when absent.
pub(crate) fn tokens(value: Option<&Value>, name: &'static str) -> Result<Option<u32>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    apply(name, COUNT_TOKENS, value)?;
    Ok(value.as_u64().and_then(|n| u32::try_from(n).ok()))
}

/// `true` or `false`, or `None` when absent.
pub(crate) fn flag(value: Option<&Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    apply(name, Rule::Bool, value)?;
    Ok(value.as_bool())
}

/// A bounded number (`temperature`, `top_p`, `min_p`), or `None`.
pub(crate) fn number(value: Option<&Value>, name: &'static str) -> Result<Option<f64>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    apply(name, rule_of(name), value)?;
    Ok(value.as_f64())
}

/// A number in `min..=max` for a route whose range differs from OpenAI's
/// (Anthropic's `temperature` is 0..=1), or `None` when absent.
pub(crate) fn within(
    value: Option<&Value>,
    name: &'static str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    apply(name, Rule::Number { min, max }, value)?;
    Ok(value.as_f64())
}

/// The seed as 64 bits (a negative seed keeps its bit pattern), or `None`.
pub(crate) fn seed(value: Option<&Value>) -> Result<Option<u64>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    apply("seed", Rule::Seed, value)?;
    Ok(value.as_u64().or_else(|| value.as_i64().map(|n| n as u64)))
}

/// The stop strings (none when absent).
pub(crate) fn stop(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(vec![]),
        Some(v) => {
            apply("stop", Rule::Stop, v)?;
            Ok(match v {
                Value::String(s) => vec![s.clone()],
                Value::Array(items) => items
                    .iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect(),
                _ => vec![],
            })
        }
    }
}

/// The text of OpenAI's `prediction` (Predicted Outputs:
/// `{"type": "content", "content": TEXT}`, the content a string or a list
/// of text parts), or `None` when absent.
pub(crate) fn prediction(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let refuse = |message: String, field| Err(ApiError::bad_request(message, Some(field)));
    let Value::Object(fields) = value else {
        return refuse(
            format!("'prediction' must be an object {{\"type\": \"content\", \"content\": ...}}, got {value}"),
            "prediction",
        );
    };
    if let Some(unknown) = fields.keys().find(|k| *k != "type" && *k != "content") {
        return refuse(
            format!(
                "'prediction' has an unknown field '{unknown}' (it takes 'type' and 'content')"
            ),
            "prediction",
        );
    }
    match fields.get("type") {
        Some(Value::String(t)) if t == "content" => {}
        other => {
            return refuse(
                format!(
                    "'prediction.type' must be \"content\", got {}",
                    other.map_or("nothing".to_string(), ToString::to_string)
                ),
                "prediction.type",
            )
        }
    }
    match fields.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(i, part)| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                (Some("text"), Some(Value::String(text))) => Ok(text.as_str()),
                _ => Err(ApiError::bad_request(
                    format!("'prediction.content[{i}]' must be a text part {{\"type\": \"text\", \"text\": ...}}, got {part}"),
                    Some("prediction.content"),
                )),
            })
            .collect::<Result<Vec<&str>, ApiError>>()
            .map(|texts| Some(texts.concat())),
        other => refuse(
            format!(
                "'prediction.content' must be a string or a list of text parts, got {}",
                other.map_or("nothing".to_string(), ToString::to_string)
            ),
            "prediction.content",
        ),
    }
}

fn rule_of(name: &str) -> Rule {
    FIELDS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
        .expect("a field with a rule")
}

fn present<'a>(request: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    request.get(name).filter(|v| !v.is_null())
}

fn apply(name: &'static str, rule: Rule, value: &Value) -> Result<(), ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some(name)));
    match rule {
        Rule::Count { min, max } => match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(()),
            _ => bad(format!(
                "'{name}' must be a whole number from {min} to {max}, not {value}"
            )),
        },
        Rule::Number { min, max } => match value.as_f64() {
            Some(n) if (min..=max).contains(&n) => Ok(()),
            _ => bad(format!(
                "'{name}' must be a number from {min} to {max}, not {value}"
            )),
        },
        Rule::Seed if value.is_u64() || value.is_i64() => Ok(()),
        Rule::Seed => bad(format!(
            "'{name}' must be a whole number that fits 64 bits, not {value}"
        )),
        Rule::Bool if value.is_boolean() => Ok(()),
        Rule::Bool => bad(format!("'{name}' must be true or false, not {value}")),
        Rule::Stop => match value {
            Value::String(_) => Ok(()),
            Value::Array(items) => match items.iter().position(|s| !s.is_string()) {
                None => Ok(()),
                Some(i) => bad(format!(
                    "'{name}[{i}]' must be a string, not {}; 'stop' is a string or a list of strings",
                    items[i]
                )),
            },
            _ => bad(format!(
                "'{name}' must be a string or a list of strings, not {value}"
            )),
        },
        Rule::StreamOptions => match value {
            Value::Object(options) => match options.get("include_usage") {
                None | Some(Value::Null) | Some(Value::Bool(_)) => Ok(()),
                Some(other) => bad(format!(
                    "'{name}.include_usage' must be true or false, not {other}"
                )),
            },
            _ => bad(format!(
                "'{name}' must be an object such as {{\"include_usage\": true}}, not {value}"
            )),
        },
    }
}

/// `messages`: a non-empty list of objects, each with a string `role` and a
/// `content` that is a string, a list of content parts, or null (an
/// assistant turn with tool calls).
fn messages(value: Option<&Value>) -> Result<(), ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("messages")));
    let items = match value {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return bad("'messages' must be a non-empty list of messages".into())
        }
        Some(other) => return bad(format!("'messages' must be a list, not {other}")),
    };
    for (i, item) in items.iter().enumerate() {
        let Value::Object(message) = item else {
            return bad(format!(
                "'messages[{i}]' must be an object with 'role' and 'content', not {item}"
            ));
        };
        match message.get("role") {
            Some(Value::String(_)) => {}
            None => return bad(format!("'messages[{i}].role' is missing")),
            Some(other) => {
                return bad(format!(
                    "'messages[{i}].role' must be a string, not {other}"
                ))
            }
        }
        match message.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                if let Some(j) = parts
                    .iter()
                    .position(|p| !p.get("type").is_some_and(Value::is_string))
                {
                    return bad(format!(
                        "'messages[{i}].content[{j}]' must be a content part object with a string 'type', not {}",
                        parts[j]
                    ));
                }
                for (j, part) in parts.iter().enumerate() {
                    if part.get("type").and_then(Value::as_str) == Some("image_url") {
                        image_part(part)
                            .or_else(|why| bad(format!("'messages[{i}].content[{j}].{why}")))?;
                    }
                }
            }
            Some(other) => {
                return bad(format!(
                "'messages[{i}].content' must be a string or a list of content parts, not {other}"
            ))
            }
        }
        super::tools::check_message(i, message)?;
    }
    Ok(())
}

/// The image types a `data:` URL may carry.
const IMAGE_TYPES: &[&str] = &["png", "jpeg", "jpg", "webp", "gif", "bmp"];

/// An OpenAI `image_url` part: `{"type": "image_url", "image_url": {"url":
/// "data:image/png;base64,...", "detail": "auto"}}`. The image travels in
/// the request as a base64 `data:` URL, or is named by a `file:` or
/// `http(s)` URL, which the host reads or fetches where the operator allows
/// it ([`super::images`], after this check). On error: the path inside the
/// part and what is wrong with it.
pub(super) fn image_part(part: &Value) -> Result<(), String> {
    let Some(Value::Object(image)) = part.get("image_url") else {
        return Err(
            "image_url' must be an object such as {\"url\": \"data:image/png;base64,...\"}".into(),
        );
    };
    match image.get("detail") {
        None | Some(Value::Null) => {}
        Some(Value::String(d)) if ["auto", "low", "high"].contains(&d.as_str()) => {}
        Some(other) => {
            return Err(format!(
                "image_url.detail' must be \"auto\", \"low\" or \"high\", not {other}"
            ))
        }
    }
    let Some(Value::String(url)) = image.get("url") else {
        return Err("image_url.url' is missing: a data: URL of the image (base64)".into());
    };
    if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("file:") {
        return match reqwest::Url::parse(url) {
            Ok(parsed) if parsed.scheme() != "file" || parsed.to_file_path().is_ok() => Ok(()),
            Ok(_) => Err("image_url.url' is not a local file's URL (file:///absolute/path)".into()),
            Err(e) => Err(format!("image_url.url' is not a URL: {e}")),
        };
    }
    let (kind, data) = url
        .strip_prefix("data:image/")
        .and_then(|rest| rest.split_once(";base64,"))
        .ok_or("image_url.url' must be a data: URL such as data:image/png;base64,..., or a file: or http(s) URL where the operator allows them")?;
    if !IMAGE_TYPES.contains(&kind) {
        return Err(format!(
            "image_url.url' is an image/{kind}; the image types taken are {}",
            IMAGE_TYPES.join(", ")
        ));
    }
    use base64::Engine;
    match base64::engine::general_purpose::STANDARD.decode(data) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        Ok(_) => Err("image_url.url' holds no image: its base64 data is empty".into()),
        Err(e) => Err(format!("image_url.url' is not valid base64: {e}")),
    }
}

/// `prompt`: a string, or a list of strings or of token ids (or of lists of
/// token ids), not empty.
fn prompt(value: Option<&Value>) -> Result<(), ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("prompt")));
    let is_tokens = |v: &Value| {
        v.as_array()
            .is_some_and(|t| !t.is_empty() && t.iter().all(Value::is_u64))
    };
    // An empty prompt has no token to continue from: native-mlx refuses it,
    // and mlx-lm's generation thread dies on it (found by schemathesis).
    let empty = match value {
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(items)) => items.iter().any(|s| s.as_str() == Some("")),
        _ => false,
    };
    if empty {
        return bad("'prompt' is empty: give at least one character of text to continue".into());
    }
    match value {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(items))
            if !items.is_empty()
                && (items.iter().all(Value::is_string)
                    || items.iter().all(Value::is_u64)
                    || items.iter().all(is_tokens)) =>
        {
            Ok(())
        }
        None | Some(Value::Null) => bad("'prompt' is required: a string".into()),
        Some(other) => bad(format!(
            "'prompt' must be a string, a list of strings or a list of token ids, not {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};
    use serde_json::json;

    use super::*;

    /// Checks a chat request built from `fields` (with a valid `messages`
    /// unless `fields` has its own) and renders the verdict.
    fn check_chat(fields: Value, expect: Expect) {
        let mut request = json!({ "messages": [{ "role": "user", "content": "hi" }] });
        for (k, v) in fields.as_object().unwrap() {
            request[k] = v.clone();
        }
        let verdict = match super::check(Route::Chat, request.as_object().unwrap()) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
        };
        expect.assert_eq(&verdict);
    }

    #[test]
    fn image_parts_carry_an_inline_image() {
        let with = |image: Value| {
            json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": image},
            ]}]})
        };
        // "\x89PNG" in base64.
        check_chat(
            with(json!({"url": "data:image/png;base64,iVBORw==", "detail": "low"})),
            expect!["ok"],
        );
        let cases = [
            json!("data:image/png;base64,iVBORw=="),
            json!({"detail": "low"}),
            json!({"url": "data:image/png;base64,iVBORw==", "detail": "ultra"}),
            json!({"url": "https://example.com/cat.png"}),
            json!({"url": "file:///etc/passwd"}),
            json!({"url": "file://server/share/cat.png"}),
            json!({"url": "http://[::1"}),
            json!({"url": "data:text/plain;base64,aGk="}),
            json!({"url": "data:image/tiff;base64,aGk="}),
            json!({"url": "data:image/png;base64,not base64!"}),
            json!({"url": "data:image/png;base64,"}),
        ];
        let verdicts: Vec<String> = cases
            .into_iter()
            .map(|image| {
                let request = with(image);
                match super::check(Route::Chat, request.as_object().unwrap()) {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
                }
            })
            .collect();
        expect![[r#"
            400 Some("messages"): 'messages[0].content[1].image_url' must be an object such as {"url": "data:image/png;base64,..."}
            400 Some("messages"): 'messages[0].content[1].image_url.url' is missing: a data: URL of the image (base64)
            400 Some("messages"): 'messages[0].content[1].image_url.detail' must be "auto", "low" or "high", not "ultra"
            ok
            ok
            400 Some("messages"): 'messages[0].content[1].image_url.url' is not a local file's URL (file:///absolute/path)
            400 Some("messages"): 'messages[0].content[1].image_url.url' is not a URL: invalid IPv6 address
            400 Some("messages"): 'messages[0].content[1].image_url.url' must be a data: URL such as data:image/png;base64,..., or a file: or http(s) URL where the operator allows them
            400 Some("messages"): 'messages[0].content[1].image_url.url' is an image/tiff; the image types taken are png, jpeg, jpg, webp, gif, bmp
            400 Some("messages"): 'messages[0].content[1].image_url.url' is not valid base64: Invalid symbol 32, offset 3.
            400 Some("messages"): 'messages[0].content[1].image_url.url' holds no image: its base64 data is empty"#]]
        .assert_eq(&verdicts.join("\n"));
    }

    #[test]
    fn stop_must_be_strings() {
        check_chat(json!({"stop": "x"}), expect!["ok"]);
        check_chat(json!({"stop": ["a", "b"]}), expect!["ok"]);
        check_chat(
            json!({"stop": 5}),
            expect![[r#"400 Some("stop"): 'stop' must be a string or a list of strings, not 5"#]],
        );
        check_chat(
            json!({"stop": [1]}),
            expect![[
                r#"400 Some("stop"): 'stop[0]' must be a string, not 1; 'stop' is a string or a list of strings"#
            ]],
        );
    }

    #[test]
    fn messages_must_be_objects_with_text_or_parts() {
        check_chat(
            json!({"messages": ["hi"]}),
            expect![[
                r#"400 Some("messages"): 'messages[0]' must be an object with 'role' and 'content', not "hi""#
            ]],
        );
        check_chat(
            json!({"messages": [{"role": "user", "content": 5}]}),
            expect![[
                r#"400 Some("messages"): 'messages[0].content' must be a string or a list of content parts, not 5"#
            ]],
        );
        check_chat(
            json!({"messages": [{"content": "hi"}]}),
            expect![[r#"400 Some("messages"): 'messages[0].role' is missing"#]],
        );
        check_chat(
            json!({"messages": []}),
            expect![[r#"400 Some("messages"): 'messages' must be a non-empty list of messages"#]],
        );
        check_chat(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            expect!["ok"],
        );
        check_chat(
            json!({"messages": [{"role": "user", "content": [5]}]}),
            expect![[
                r#"400 Some("messages"): 'messages[0].content[0]' must be a content part object with a string 'type', not 5"#
            ]],
        );
    }

    #[test]
    fn token_counts_are_never_coerced() {
        check_chat(json!({"max_tokens": 16}), expect!["ok"]);
        check_chat(
            json!({"max_tokens": 1e300}),
            expect![[
                r#"400 Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 1e+300"#
            ]],
        );
        check_chat(
            json!({"max_tokens": 18446744073709551616.0}),
            expect![[
                r#"400 Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 1.8446744073709552e+19"#
            ]],
        );
        check_chat(
            json!({"max_tokens": -5}),
            expect![[
                r#"400 Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not -5"#
            ]],
        );
        check_chat(
            json!({"max_tokens": 2.5}),
            expect![[
                r#"400 Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 2.5"#
            ]],
        );
        check_chat(
            json!({"top_k": 1e300}),
            expect![[
                r#"400 Some("top_k"): 'top_k' must be a whole number from 0 to 4294967295, not 1e+300"#
            ]],
        );
        check_chat(
            json!({"top_k": -5}),
            expect![[
                r#"400 Some("top_k"): 'top_k' must be a whole number from 0 to 4294967295, not -5"#
            ]],
        );
        check_chat(
            json!({"top_k": 2.5}),
            expect![[
                r#"400 Some("top_k"): 'top_k' must be a whole number from 0 to 4294967295, not 2.5"#
            ]],
        );
        check_chat(json!({"top_k": 0, "max_tokens": null}), expect!["ok"]);
    }

    #[test]
    fn sampling_numbers_stay_in_range() {
        check_chat(
            json!({"temperature": 0.7, "top_p": 1, "min_p": 0.05, "seed": -1}),
            expect!["ok"],
        );
        check_chat(
            json!({"temperature": -0.1}),
            expect![[
                r#"400 Some("temperature"): 'temperature' must be a number from 0 to 2, not -0.1"#
            ]],
        );
        check_chat(
            json!({"temperature": "hot"}),
            expect![[
                r#"400 Some("temperature"): 'temperature' must be a number from 0 to 2, not "hot""#
            ]],
        );
        check_chat(
            json!({"top_p": 1.5}),
            expect![[r#"400 Some("top_p"): 'top_p' must be a number from 0 to 1, not 1.5"#]],
        );
        check_chat(
            json!({"seed": 1.5}),
            expect![[
                r#"400 Some("seed"): 'seed' must be a whole number that fits 64 bits, not 1.5"#
            ]],
        );
        check_chat(
            json!({"stream": "yes"}),
            expect![[r#"400 Some("stream"): 'stream' must be true or false, not "yes""#]],
        );
        check_chat(
            json!({"stream_options": {"include_usage": 1}}),
            expect![[
                r#"400 Some("stream_options"): 'stream_options.include_usage' must be true or false, not 1"#
            ]],
        );
    }

    #[test]
    fn tools_and_tool_messages_are_checked() {
        let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        check_chat(
            json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false}),
            expect!["ok"],
        );
        check_chat(
            json!({"tools": {}}),
            expect![[
                r#"400 Some("tools"): 'tools' must be a list of {"type": "function", "function": {"name", "parameters"}} objects, not {}"#
            ]],
        );
        check_chat(
            json!({"tools": [{"type": "retrieval"}]}),
            expect![[
                r#"400 Some("tools"): 'tools[0].type' must be "function" (the only kind of tool), not "retrieval""#
            ]],
        );
        check_chat(
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            expect![[
                r#"400 Some("tools"): 'tools[0].function.name' must be 1 to 64 letters, digits, '_' or '-', not "bad name""#
            ]],
        );
        check_chat(
            json!({"tools": [weather, weather]}),
            expect![[
                r#"400 Some("tools"): 'tools[1].function.name' repeats 'get_weather'; each tool needs its own name"#
            ]],
        );
        check_chat(
            json!({"tool_choice": "required"}),
            expect![[
                r#"400 Some("tool_choice"): 'tool_choice' is "required" but the request has no 'tools'"#
            ]],
        );
        check_chat(
            json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
            expect![[
                r#"400 Some("tool_choice"): 'tool_choice' names function 'other', which is not in 'tools' (get_weather)"#
            ]],
        );
        check_chat(
            json!({"tools": [weather], "tool_choice": 1}),
            expect![[
                r#"400 Some("tool_choice"): 'tool_choice' must be "auto", "none", "required" or {"type": "function", "function": {"name": "..."}}, not 1"#
            ]],
        );
        check_chat(
            json!({"parallel_tool_calls": "yes"}),
            expect![[
                r#"400 Some("parallel_tool_calls"): 'parallel_tool_calls' must be true or false, not "yes""#
            ]],
        );
        check_chat(
            json!({"response_format": {"type": "xml"}}),
            expect![[
                r#"400 Some("response_format"): 'response_format.type' must be "text", "json_object" or "json_schema", not "xml""#
            ]],
        );
        check_chat(
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
            expect![[
                r#"400 Some("response_format"): 'response_format.json_schema.name' must be a string"#
            ]],
        );
        check_chat(
            json!({"messages": [
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]}),
            expect!["ok"],
        );
        check_chat(
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}]}]}),
            expect![[
                r#"400 Some("messages"): 'messages[0].tool_calls[0].function.arguments' must be a string of JSON, as the answer gave it"#
            ]],
        );
        // Text that is not JSON failed mlx_lm.server's generation (found by
        // schemathesis); an empty string is a call without arguments.
        check_chat(
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{\"city\": "}}]}]}),
            expect![[
                r#"400 Some("messages"): 'messages[0].tool_calls[0].function.arguments' must be a string of JSON, as the answer gave it; it is not JSON (EOF while parsing a value at line 1 column 9)"#
            ]],
        );
        check_chat(
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": ""}}]}]}),
            expect!["ok"],
        );
        check_chat(
            json!({"messages": [{"role": "tool", "content": "42"}]}),
            expect![[
                r#"400 Some("messages"): 'messages[0].tool_call_id' must be a string: the id of the call this message answers"#
            ]],
        );
    }

    #[test]
    fn prompts_are_text_or_tokens() {
        let verdict = |prompt: Value| match super::check(
            Route::Completion,
            json!({ "prompt": prompt }).as_object().unwrap(),
        ) {
            Ok(()) => "ok".to_string(),
            Err(e) => e.message,
        };
        assert_eq!(verdict(json!("hi")), "ok");
        assert_eq!(verdict(json!([1, 2, 3])), "ok");
        assert_eq!(verdict(json!(["a", "b"])), "ok");
        expect![[r#"'prompt' must be a string, a list of strings or a list of token ids, not 5"#]]
            .assert_eq(&verdict(json!(5)));
        expect!["'prompt' is empty: give at least one character of text to continue"]
            .assert_eq(&verdict(json!("")));
        expect!["'prompt' is empty: give at least one character of text to continue"]
            .assert_eq(&verdict(json!(["a", ""])));
        expect![[
            r#"'prompt' must be a string, a list of strings or a list of token ids, not ["a",1]"#
        ]]
        .assert_eq(&verdict(json!(["a", 1])));
    }
}
