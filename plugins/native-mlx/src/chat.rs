//! Chat templates from `tokenizer_config.json` (or `chat_template.jinja`), rendered as Hugging Face renders them.
//!
//! transformers renders with Jinja2 in a sandbox with `trim_blocks` and
//! `lstrip_blocks`, loop controls, a `raise_exception` global, a
//! `strftime_now` global and its own `tojson` filter (Python's `json.dumps`
//! with `ensure_ascii=False`: `", "` and `": "` separators, no HTML
//! escaping). minijinja with Python-compatible string methods is set up the
//! same way, so the prompt text — and therefore the prompt tokens — match.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::tokenizer::{read_json, special_token};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`…
    pub role: String,
    /// The text, or text and images.
    pub content: Content,
    /// Whatever else the template may read (`tool_calls`, `name`…).
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl ChatMessage {
    /// A message with just a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self::with_parts(role, Content::Text(content.into()))
    }

    /// A message of text and images, in the order the template places them.
    pub fn with_parts(role: impl Into<String>, content: Content) -> Self {
        Self {
            role: role.into(),
            content,
            extra: Map::new(),
        }
    }

    /// The images of the message, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageData> {
        let parts = match &self.content {
            Content::Parts(parts) => parts.as_slice(),
            Content::Text(_) => &[],
        };
        parts.iter().filter_map(|part| match part {
            ContentPart::Image(image) => Some(image),
            ContentPart::Text { .. } => None,
        })
    }
}

/// What a message says: a string, or a list of parts, as transformers
/// passes either to the template (`message['content'] is string`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text alone.
    Text(String),
    /// Text and images, in order.
    Parts(Vec<ContentPart>),
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_owned())
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

/// One part of a message's content. The template sees `{"type": "text",
/// "text": …}` and `{"type": "image"}` (transformers' shapes, which Gemma
/// 3's template reads); an image's bytes stay out of the template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    Image(ImageData),
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart::Text { text: text.into() }
    }

    /// An image part of a PNG, JPEG, GIF, WebP or BMP file's bytes.
    pub fn image(bytes: impl Into<Arc<[u8]>>) -> Self {
        ContentPart::Image(ImageData {
            bytes: bytes.into(),
        })
    }
}

/// An image's encoded bytes (PNG, JPEG, GIF, WebP or BMP), shared, never shown to the
/// template (a part deserialized from JSON has none).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ImageData {
    /// The file's bytes.
    #[serde(skip)]
    pub bytes: Arc<[u8]>,
}

/// Rendering options beyond the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    /// End with the opening of an assistant turn (what a completion request wants).
    pub add_generation_prompt: bool,
    /// Tool schemas, passed as `tools` (`none` when absent, as transformers does).
    pub tools: Option<Json>,
    /// Extra template variables (`enable_thinking`, …).
    pub extra: Map<String, Json>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            tools: None,
            extra: Map::new(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as strings.
    special_tokens: Map<String, Json>,
}

const TEMPLATE: &str = "chat";

impl ChatTemplate {
    /// Finds the template of a model folder: `chat_template.jinja`, else
    /// `chat_template.json`, else `tokenizer_config.json`'s `chat_template`
    /// (a string, or a list of named templates of which `default` is taken).
    /// `Ok(None)` when the model has none.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let jinja = dir.join("chat_template.jinja");
        let source = match std::fs::read_to_string(&jinja) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let separate = read_json(&dir.join("chat_template.json"))?;
                let value = separate
                    .as_ref()
                    .and_then(|j| j.get("chat_template"))
                    .or_else(|| config.get("chat_template"));
                value.and_then(template_source)
            }
            Err(source) => {
                return Err(Error::Io {
                    path: jinja,
                    source,
                })
            }
        };
        let Some(source) = source else {
            return Ok(None);
        };
        let mut special_tokens = Map::new();
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(token) = special_token(&config, key) {
                special_tokens.insert(key.to_owned(), Json::String(token));
            }
        }
        Self::new(source, special_tokens).map(Some)
    }

    /// Compiles `source` with the given special-token strings.
    pub fn new(source: String, special_tokens: Map<String, Json>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE, source)
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        Ok(Self {
            env,
            special_tokens,
        })
    }

    /// Renders a conversation to prompt text.
    pub fn render(&self, messages: &[ChatMessage], options: &ChatOptions) -> Result<String> {
        let mut context = self.special_tokens.clone();
        context.extend(options.extra.clone());
        let messages = serde_json::to_value(messages)
            .map_err(|e| Error::InvalidRequest(format!("messages: {e}")))?;
        context.insert("messages".into(), messages);
        context.insert("tools".into(), options.tools.clone().unwrap_or(Json::Null));
        context.insert("documents".into(), Json::Null);
        context.insert(
            "add_generation_prompt".into(),
            Json::Bool(options.add_generation_prompt),
        );
        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        template
            .render(Value::from_serialize(&context))
            .map_err(|e| Error::ChatTemplate(describe(&e)))
    }
}

fn template_source(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// A template error with its cause chain, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The template's own way to refuse a conversation (`raise_exception('…')`).
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=…, sort_keys=…)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for compatibility; non-ASCII is always written as is.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    python_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Writes `value` as Python's `json.dumps` does: `", "`/`": "` separators on
/// one line, or `","` and newlines with `indent`.
fn python_json(
    value: &Json,
    indent: Option<usize>,
    sort_keys: bool,
    level: usize,
    out: &mut String,
) {
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, level + 1);
                python_json(item, indent, sort_keys, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(entries) if !entries.is_empty() => {
            let mut entries: Vec<(&String, &Json)> = entries.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, level + 1);
                out.push_str(&Json::String(key.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, sort_keys, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `strftime_now(format)`: the current UTC time, for templates that print
/// today's date (Llama 3). Supports the common `%` codes.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(source: &str) -> ChatTemplate {
        let special = json!({"bos_token": "<s>", "eos_token": "</s>"});
        ChatTemplate::new(source.to_owned(), special.as_object().unwrap().clone()).unwrap()
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ]
    }

    #[test]
    fn chatml_with_generation_prompt() {
        let t = template(
            "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        );
        let text = t.render(&conversation(), &ChatOptions::default()).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn trim_blocks_bos_and_python_methods() {
        // Llama-2 style: block tags on their own lines, bos_token, .strip().
        let t = template(
            "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[INST] {{ m.content.strip() }} [/INST]\n  {% endif %}\n{% endfor %}\n",
        );
        let text = t
            .render(
                &[ChatMessage::new("user", "  Hi  ")],
                &ChatOptions::default(),
            )
            .unwrap();
        assert_eq!(text, "<s>\n[INST] Hi [/INST]\n");
    }

    #[test]
    fn raise_exception_reaches_the_caller() {
        let t = template("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}");
        let err = t
            .render(&conversation(), &ChatOptions::default())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversation must start with user"),
            "{err}"
        );
    }

    #[test]
    fn tojson_writes_like_python() {
        let t = template("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}");
        let options = ChatOptions {
            tools: Some(json!([{"name": "get", "params": {"n": [1, 2], "city": "Zürich"}}])),
            ..ChatOptions::default()
        };
        let text = t.render(&[], &options).unwrap();
        assert_eq!(
            text,
            "[{\"name\": \"get\", \"params\": {\"n\": [1, 2], \"city\": \"Zürich\"}}]|{\n  \"name\": \"get\",\n  \"params\": {\n    \"n\": [\n      1,\n      2\n    ],\n    \"city\": \"Zürich\"\n  }\n}"
        );
    }

    #[test]
    fn tools_default_to_none_and_extra_variables_pass() {
        let t = template("{{ tools is none }} {{ enable_thinking }} {{ loop_test }}{% for i in [1,2,3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}");
        let mut options = ChatOptions::default();
        options.extra.insert("enable_thinking".into(), json!(false));
        // Booleans print as Python's, like Jinja2's.
        assert_eq!(t.render(&[], &options).unwrap(), "True False 1");
    }

    #[test]
    fn image_parts_reach_the_template_without_their_bytes() {
        let t = template(
            "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}[img{{ p | length }}]{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}|{% endfor %}",
        );
        let parts = Content::Parts(vec![
            ContentPart::text("Look: "),
            ContentPart::image(vec![1u8, 2, 3]),
            ContentPart::text(" and "),
            ContentPart::image(vec![4u8]),
        ]);
        let messages = [
            ChatMessage::new("system", "S"),
            ChatMessage::with_parts("user", parts),
        ];
        let text = t.render(&messages, &ChatOptions::default()).unwrap();
        // The image part is `{"type": "image"}` alone.
        assert_eq!(text, "S|Look: [img1] and [img1]|");
        let images: Vec<&[u8]> = messages[1].images().map(|i| &i.bytes[..]).collect();
        assert_eq!(images, [&[1u8, 2, 3][..], &[4u8][..]]);
        // Messages as JSON, text or parts.
        let parsed: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
        ]))
        .unwrap();
        assert_eq!(parsed[0].content, Content::Text("hi".into()));
        assert_eq!(parsed[1].images().count(), 1);
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %%", 1_722_000_309),
            "26 Jul 2024 13:25:09 Friday %"
        );
    }
}
