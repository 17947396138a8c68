//! The streaming tool-call parser: fed an answer's text in whatever chunks
//! the engine sent, it passes text on at once (holding back only a tail
//! that may begin a call's marker), reads each call to its end, and emits
//! the call's index, id and name, then its arguments.
//!
//! A call in JSON (`{"name": …, "arguments": {…}}`, Mistral's
//! `name[ARGS]{…}`) is streamed: its index, id and name go as soon as its
//! beginning is complete, then its arguments as they arrive, cut only
//! where a closing marker may begin. Other markups (Qwen's XML, Gemma's)
//! are read whole when the call ends.
//!
//! A call the parser cannot read (a body that is not such JSON, a missing
//! name) never ends the answer: its text is passed on as text, and the log
//! says so. A streamed call whose arguments break off after it began keeps
//! what was passed on (it cannot be taken back, as with every server that
//! streams arguments), and the log says so.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{partial_tail, push_text, Delta, Format};

/// Where a call ends, given the marker that opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// At this closing marker.
    Marker(&'static str),
    /// Where the JSON value after the opening marker ends (after Mistral's
    /// `name[ARGS]`, when the value is not a list).
    Json,
}

/// A call's opening marker and how it ends.
#[derive(Debug, Clone, Copy)]
struct Open {
    marker: &'static str,
    end: End,
    /// Whether the marker belongs to the body (`<function=`, Llama's `{`).
    keep: bool,
}

const TOOL_CALL: Open = Open {
    marker: "<tool_call>",
    end: End::Marker("</tool_call>"),
    keep: false,
};
const FUNCTION: Open = Open {
    marker: "<function=",
    end: End::Marker("</function>"),
    keep: true,
};
const GEMMA: Open = Open {
    marker: "<start_function_call>",
    end: End::Marker("<end_function_call>"),
    keep: false,
};
const MISTRAL: Open = Open {
    marker: "[TOOL_CALLS]",
    end: End::Json,
    keep: false,
};
const PYTHON_TAG: Open = Open {
    marker: "<|python_tag|>",
    end: End::Json,
    keep: false,
};
/// Llama 3's bare JSON call, recognised only where the answer begins.
const BRACE: Open = Open {
    marker: "{",
    end: End::Json,
    keep: true,
};

/// Parameter types by function and parameter name, from the request's
/// `tools` (Qwen's XML and Gemma's markup write every value as text; the
/// schema says which are strings).
type Schemas = HashMap<String, HashMap<String, String>>;

/// One answer's tool-call parser.
pub(crate) struct Parser {
    format: Format,
    opens: &'static [Open],
    held: String,
    /// The call being read, if any.
    open: Option<Open>,
    /// Where the search for the closing marker resumes.
    scanned: usize,
    calls: usize,
    id_prefix: String,
    /// Whether answer text (not whitespace) was passed on: Llama 3's bare
    /// JSON call must begin the answer.
    texted: bool,
    /// Whether the last thing read was a call (separators after it, `;`
    /// and whitespace, are dropped).
    after_call: bool,
    schemas: Schemas,
    /// The request's function names, when it has tools (a bare JSON
    /// object naming none of them is the answer, not a call).
    names: Vec<String>,
    /// The open call whose arguments are being passed on as they arrive.
    streaming: Option<Streaming>,
    /// Whether the open call's beginning showed it cannot be streamed (a
    /// shape other than `{"name": …, "arguments": {…}}`): it is read whole.
    whole: bool,
}

/// A call being streamed: its arguments' JSON object is passed on as it
/// arrives, scanned byte by byte for its end.
#[derive(Debug)]
struct Streaming {
    index: usize,
    /// Where the next fragment starts in `held`.
    at: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Whether the arguments' object has closed.
    closed: bool,
}

impl Parser {
    /// A parser of `format` for an answer to a request with `tools` (its
    /// OpenAI `tools` list); call ids are `call_{id_prefix}_{index}`.
    pub(crate) fn new(format: Format, tools: &[Value], id_prefix: &str) -> Parser {
        let opens: &'static [Open] = match format {
            Format::Hermes | Format::QwenXml => &[TOOL_CALL, FUNCTION],
            Format::Gemma => &[GEMMA],
            Format::Mistral => &[MISTRAL],
            Format::Llama3 => &[PYTHON_TAG],
        };
        let mut schemas = Schemas::new();
        let mut names = Vec::new();
        for tool in tools {
            let function = tool.get("function").unwrap_or(tool);
            let Some(name) = function.get("name").and_then(Value::as_str) else {
                continue;
            };
            names.push(name.to_string());
            let properties = function
                .pointer("/parameters/properties")
                .and_then(Value::as_object);
            let types = properties
                .into_iter()
                .flatten()
                .filter_map(|(p, schema)| {
                    Some((p.clone(), schema.get("type")?.as_str()?.to_string()))
                })
                .collect();
            schemas.insert(name.to_string(), types);
        }
        Parser {
            format,
            opens,
            held: String::new(),
            open: None,
            scanned: 0,
            calls: 0,
            id_prefix: id_prefix.to_string(),
            texted: false,
            after_call: false,
            schemas,
            names,
            streaming: None,
            whole: false,
        }
    }

    /// How many calls were emitted.
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    /// Takes the next piece of the answer's text.
    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.held.push_str(text);
        loop {
            let progressed = match self.open {
                None => self.text(out),
                Some(open) => self.call(open, out, false),
            };
            if !progressed {
                return;
            }
        }
    }

    /// The answer is over: a call still open is read as if closed (models
    /// often stop without the closing marker), and held text passed on.
    pub(crate) fn finish(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.open {
                // Always read at the end: it drains what it read.
                Some(open) => {
                    self.call(open, out, true);
                }
                None => {
                    if !self.text(out) {
                        break;
                    }
                }
            }
        }
        let rest = std::mem::take(&mut self.held);
        self.pass_text(rest, out);
    }

    /// Text mode: passes text on up to the next opening marker. Returns
    /// whether a call opened.
    fn text(&mut self, out: &mut Vec<Delta>) -> bool {
        if self.after_call {
            let rest = self
                .held
                .trim_start_matches(|c: char| c.is_whitespace() || c == ';');
            let cut = self.held.len() - rest.len();
            self.held.drain(..cut);
            if self.held.is_empty() {
                return false;
            }
            self.after_call = false;
        }
        let bare_json = self.format == Format::Llama3 && !self.texted;
        if bare_json && self.held.trim_start().starts_with('{') {
            let at = self.held.len() - self.held.trim_start().len();
            self.held.drain(..at);
            self.open = Some(BRACE);
            self.scanned = 0;
            return true;
        }
        let found = self
            .opens
            .iter()
            .filter_map(|o| self.held.find(o.marker).map(|at| (at, *o)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, open)) = found {
            let before: String = self.held.drain(..at).collect();
            self.pass_text(before, out);
            self.open = Some(open);
            self.scanned = 0;
            return true;
        }
        let markers: Vec<&str> = self.opens.iter().map(|o| o.marker).collect();
        let mut keep = partial_tail(&self.held, &markers);
        if bare_json && self.held.trim().is_empty() {
            keep = self.held.len(); // the answer has not begun: it may be a call
        }
        let ready: String = self.held.drain(..self.held.len() - keep).collect();
        self.pass_text(ready, out);
        false
    }

    fn pass_text(&mut self, text: String, out: &mut Vec<Delta>) {
        self.texted |= !text.trim().is_empty();
        push_text(out, Delta::Text(text));
    }

    /// Call mode: reads the call opened by `open` if its end has come (or
    /// the answer is over, `at_end`). Returns whether it was read.
    fn call(&mut self, open: Open, out: &mut Vec<Delta>, at_end: bool) -> bool {
        self.stream(open, out);
        let after = &self.held[open.marker.len()..];
        let (body_end, end) = match open.end {
            End::Marker(close) => {
                let from = self.scanned.saturating_sub(close.len()).min(after.len());
                let from = (0..=from)
                    .rev()
                    .find(|&i| after.is_char_boundary(i))
                    .unwrap_or(0);
                match after[from..].find(close) {
                    Some(at) => (from + at, from + at + close.len()),
                    None if at_end => (after.len(), after.len()),
                    None => {
                        self.scanned = after.len();
                        return false;
                    }
                }
            }
            End::Json => {
                // Offsets into `after`; a kept marker (`{`) is part of the JSON.
                let (text, offset) = match open.keep {
                    true => (&self.held[..], open.marker.len()),
                    false => (after, 0),
                };
                match json_call_end(self.format, text) {
                    Scan::Complete(end) => (end - offset, end - offset),
                    Scan::Partial if !at_end => return false,
                    Scan::Partial | Scan::Bad => (after.len(), after.len()),
                }
            }
        };
        let raw: String = self.held.drain(..open.marker.len() + end).collect();
        let body = if open.keep {
            &raw[..open.marker.len() + body_end]
        } else {
            &raw[open.marker.len()..open.marker.len() + body_end]
        };
        self.open = None;
        self.scanned = 0;
        self.whole = false;
        if let Some(streamed) = self.streaming.take() {
            // Passed on already; what follows its arguments is the markup's.
            if !streamed.closed {
                tracing::warn!(
                    "a {} tool call ended before its arguments did: {}",
                    self.format.name(),
                    raw.chars().take(200).collect::<String>()
                );
            }
            self.after_call = true;
            return true;
        }
        match self.read(open, body) {
            Ok(calls) if !calls.is_empty() => {
                for (name, arguments, id) in calls {
                    let index = self.calls;
                    self.calls += 1;
                    let id = id.unwrap_or_else(|| format!("call_{}_{index}", self.id_prefix));
                    out.push(Delta::Call { index, id, name });
                    out.push(Delta::Args {
                        index,
                        fragment: arguments,
                    });
                }
                self.after_call = true;
            }
            Ok(_) => self.pass_text(raw, out),
            Err(why) => {
                tracing::warn!(
                    "a {} tool call could not be read ({why}); it is passed on as text: {}",
                    self.format.name(),
                    raw.chars().take(200).collect::<String>()
                );
                self.pass_text(raw, out);
            }
        }
        true
    }

    /// Passes on what arrived of the open call: its index, id and name as
    /// soon as its beginning (`{"name": "…", "arguments": {`, or Mistral's
    /// `name[ARGS]{`) is complete, then its arguments as they come. A call
    /// of another shape (Qwen's XML, Gemma's markup, arguments as a string)
    /// is read whole when it ends.
    fn stream(&mut self, open: Open, out: &mut Vec<Delta>) {
        if self.streaming.is_none() && !self.whole {
            let start = match open.keep {
                true => 0,
                false => open.marker.len(),
            };
            let body = &self.held[start..];
            let head = match open.marker {
                "[TOOL_CALLS]" => mistral_head(body),
                "<tool_call>" | "<|python_tag|>" | "{" => json_head(body),
                _ => Head::No,
            };
            match head {
                Head::Incomplete => return,
                Head::No => {
                    self.whole = true;
                    return;
                }
                Head::Yes { name, id, args } => {
                    // A bare JSON answer naming no tool is text, read whole.
                    if open.marker == "{" && !self.names.is_empty() && !self.names.contains(&name) {
                        self.whole = true;
                        return;
                    }
                    let index = self.calls;
                    self.calls += 1;
                    let id = id.unwrap_or_else(|| format!("call_{}_{index}", self.id_prefix));
                    out.push(Delta::Call { index, id, name });
                    self.streaming = Some(Streaming {
                        index,
                        at: start + args,
                        depth: 0,
                        in_string: false,
                        escaped: false,
                        closed: false,
                    });
                }
            }
        }
        let Some(s) = self.streaming.as_mut().filter(|s| !s.closed) else {
            return;
        };
        let from = s.at;
        // Never past the call's closing marker, nor into what may begin it.
        let limit = match open.end {
            End::Marker(close) => match self.held[from..].find(close) {
                Some(at) => from + at,
                None => self.held.len() - partial_tail(&self.held[from..], &[close]),
            },
            End::Json => self.held.len(),
        };
        let mut upto = limit;
        for (i, b) in self.held.bytes().enumerate().take(limit).skip(from) {
            if s.in_string {
                match (s.escaped, b) {
                    (true, _) => s.escaped = false,
                    (false, b'\\') => s.escaped = true,
                    (false, b'"') => s.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => s.in_string = true,
                b'{' | b'[' => s.depth += 1,
                b'}' | b']' => {
                    s.depth = s.depth.saturating_sub(1);
                    if s.depth == 0 {
                        s.closed = true;
                        upto = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        s.at = upto;
        if upto > from {
            out.push(Delta::Args {
                index: s.index,
                fragment: self.held[from..upto].to_string(),
            });
        }
    }

    /// The calls in one call's body; none when it turns out to be text
    /// (Llama 3's bare JSON object that names no function).
    fn read(&self, open: Open, body: &str) -> Result<Vec<Call>, String> {
        match open.marker {
            "<start_function_call>" => gemma_call(body, &self.schemas).map(|c| vec![c]),
            "[TOOL_CALLS]" => mistral_calls(body),
            // A bare JSON answer is a call only if it names a tool.
            "{" => {
                let known = |c: &Call| self.names.is_empty() || self.names.contains(&c.0);
                match json_calls(body) {
                    Ok(calls) if calls.iter().all(known) => Ok(calls),
                    _ => Ok(vec![]),
                }
            }
            "<|python_tag|>" => json_calls(body),
            _ => {
                let body = body.trim();
                if body.starts_with("<function=") {
                    xml_calls(body, &self.schemas)
                } else {
                    json_calls(body)
                }
            }
        }
    }
}

/// A parsed call: name, arguments (JSON text), the model's own id if any.
type Call = (String, String, Option<String>);

/// How far a JSON value has arrived.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// It ends at this byte.
    Complete(usize),
    /// Not yet.
    Partial,
    /// It is not JSON.
    Bad,
}

/// Where the call that starts `body` ends: Llama's `{…}` (several joined
/// by `;` are read one at a time), Mistral's `[…]` or `name[ARGS]{…}`.
fn json_call_end(format: Format, body: &str) -> Scan {
    let start = body.len() - body.trim_start().len();
    let rest = &body[start..];
    if format == Format::Mistral && !rest.starts_with('[') {
        let Some(args) = rest.find("[ARGS]") else {
            // A function name is short; a long run without `[ARGS]` is not one.
            return match rest.len() > 256 {
                true => Scan::Bad,
                false => Scan::Partial,
            };
        };
        let from = start + args + "[ARGS]".len();
        return match json_end(&body[from..]) {
            Scan::Complete(end) => Scan::Complete(from + end),
            other => other,
        };
    }
    match json_end(rest) {
        Scan::Complete(end) => Scan::Complete(start + end),
        other => other,
    }
}

/// Where the JSON object or list at the start of `text` (after
/// whitespace) ends.
fn json_end(text: &str) -> Scan {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let start = text.len() - text.trim_start().len();
    for (i, b) in text.bytes().enumerate().skip(start) {
        if i == start && b != b'{' && b != b'[' {
            return Scan::Bad;
        }
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Scan::Complete(i + 1);
                }
            }
            _ => {}
        }
    }
    Scan::Partial
}

/// `{"name": …, "arguments"|"parameters": {…}}`, or a list of them.
fn json_calls(body: &str) -> Result<Vec<Call>, String> {
    let value: Value = serde_json::from_str(body.trim()).map_err(|e| format!("not JSON: {e}"))?;
    match value {
        Value::Array(items) => items.iter().map(json_call).collect(),
        one => json_call(&one).map(|c| vec![c]),
    }
}

fn json_call(value: &Value) -> Result<Call, String> {
    let Some(name) = value.get("name").and_then(Value::as_str) else {
        return Err("no string 'name'".into());
    };
    let arguments = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .map_or_else(|| Ok("{}".to_string()), arguments_text)?;
    let id = value.get("id").and_then(Value::as_str).map(str::to_string);
    Ok((name.to_string(), arguments, id))
}

/// Arguments as JSON text: an object, or a string holding one.
fn arguments_text(value: &Value) -> Result<String, String> {
    match value {
        Value::Object(_) => Ok(value.to_string()),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => Ok(v.to_string()),
            _ => Err(format!("arguments {text:?} are not a JSON object")),
        },
        Value::Null => Ok("{}".into()),
        other => Err(format!("arguments {other} are not a JSON object")),
    }
}

/// Mistral's `[{…}, …]`, `name[ARGS]{…}` or `name[CALL_ID]id[ARGS]{…}`.
fn mistral_calls(body: &str) -> Result<Vec<Call>, String> {
    let body = body.trim();
    if body.starts_with('[') {
        return json_calls(body);
    }
    let (head, arguments) = body
        .split_once("[ARGS]")
        .ok_or("no [ARGS] after the function name")?;
    let (name, id) = match head.split_once("[CALL_ID]") {
        Some((name, id)) => (name, Some(id.trim().to_string())),
        None => (head, None),
    };
    let arguments: Value =
        serde_json::from_str(arguments.trim()).map_err(|e| format!("arguments: {e}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err("an empty function name".into());
    }
    Ok(vec![(name.to_string(), arguments_text(&arguments)?, id)])
}

/// Qwen's `<function=name><parameter=p>value</parameter>…</function>`, one
/// or more.
fn xml_calls(body: &str, schemas: &Schemas) -> Result<Vec<Call>, String> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let inner = rest
            .strip_prefix("<function=")
            .ok_or("text outside <function=…>")?;
        let (name, inner) = inner.split_once('>').ok_or("an unclosed <function=")?;
        let (inner, after) = inner.split_once("</function>").unwrap_or((inner, ""));
        let types = schemas.get(name.trim());
        let mut arguments = Map::new();
        let mut params = inner.trim();
        while !params.is_empty() {
            let p = params
                .strip_prefix("<parameter=")
                .ok_or("text outside <parameter=…>")?;
            let (param, p) = p.split_once('>').ok_or("an unclosed <parameter=")?;
            let (value, next) = match p.split_once("</parameter>") {
                Some(split) => split,
                None => p.split_at(p.find("<parameter=").unwrap_or(p.len())),
            };
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            let kind = types.and_then(|t| t.get(param.trim())).map(String::as_str);
            arguments.insert(param.trim().to_string(), typed(value, kind));
            params = next.trim();
        }
        let name = name.trim();
        if name.is_empty() {
            return Err("an empty function name".into());
        }
        calls.push((name.to_string(), Value::Object(arguments).to_string(), None));
        rest = after.trim().trim_start_matches("</tool_call>").trim();
    }
    Ok(calls)
}

/// A value written as text: a string where the schema says so (or where
/// it is not JSON), else the JSON it spells (`5`, `true`, `[1, 2]`).
fn typed(text: &str, kind: Option<&str>) -> Value {
    if kind == Some("string") {
        return Value::String(text.to_string());
    }
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// Gemma's `call:name{key:<escape>text<escape>,n:5,list:[…],obj:{…}}`.
fn gemma_call(body: &str, schemas: &Schemas) -> Result<Call, String> {
    let body = body.trim();
    let rest = body.strip_prefix("call:").ok_or("no 'call:'")?;
    let brace = rest.find('{').ok_or("no '{' after the function name")?;
    let name = rest[..brace].trim();
    if name.is_empty() {
        return Err("an empty function name".into());
    }
    let mut reader = GemmaReader {
        text: &rest[brace..],
        types: schemas.get(name),
    };
    let arguments = reader.object(true)?;
    if !reader.text.trim().is_empty() {
        return Err(format!("text after the arguments: {:?}", reader.text));
    }
    Ok((name.to_string(), arguments.to_string(), None))
}

/// A reader of Gemma's argument markup.
struct GemmaReader<'a> {
    text: &'a str,
    /// The function's parameter types (for the top level).
    types: Option<&'a HashMap<String, String>>,
}

const ESCAPE: &str = "<escape>";

impl GemmaReader<'_> {
    fn eat(&mut self, what: &str) -> bool {
        let trimmed = self.text.trim_start();
        match trimmed.strip_prefix(what) {
            Some(rest) => {
                self.text = rest;
                true
            }
            None => false,
        }
    }

    fn object(&mut self, top: bool) -> Result<Value, String> {
        if !self.eat("{") {
            return Err("expected '{'".into());
        }
        let mut map = Map::new();
        if self.eat("}") {
            return Ok(Value::Object(map));
        }
        loop {
            let colon = self.text.find(':').ok_or("a key without ':'")?;
            let key = self.text[..colon].trim().to_string();
            self.text = &self.text[colon + 1..];
            let kind = match top {
                true => self.types.and_then(|t| t.get(&key)).map(String::as_str),
                false => None,
            };
            let value = self.value(kind)?;
            map.insert(key, value);
            if self.eat("}") {
                return Ok(Value::Object(map));
            }
            if !self.eat(",") {
                return Err("expected ',' or '}'".into());
            }
        }
    }

    fn value(&mut self, kind: Option<&str>) -> Result<Value, String> {
        if self.eat(ESCAPE) {
            let end = self.text.find(ESCAPE).ok_or("an unclosed <escape>")?;
            let text = self.text[..end].to_string();
            self.text = &self.text[end + ESCAPE.len()..];
            return Ok(Value::String(text));
        }
        let trimmed = self.text.trim_start();
        if trimmed.starts_with('{') {
            return self.object(false);
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Ok(Value::Array(items));
            }
            loop {
                items.push(self.value(None)?);
                if self.eat("]") {
                    return Ok(Value::Array(items));
                }
                if !self.eat(",") {
                    return Err("expected ',' or ']'".into());
                }
            }
        }
        let end = trimmed.find([',', '}', ']']).unwrap_or(trimmed.len());
        let scalar = trimmed[..end].trim();
        self.text = &trimmed[end..];
        Ok(typed(scalar, kind))
    }
}

/// What the beginning of a call says.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Not enough has arrived to tell.
    Incomplete,
    /// A shape that is read whole.
    No,
    /// The call's name (and the model's own id), and where its arguments'
    /// object begins (a byte offset into the text given).
    Yes {
        name: String,
        id: Option<String>,
        args: usize,
    },
}

/// `{"name": "…", "arguments"|"parameters": {` at the start of `text`.
fn json_head(text: &str) -> Head {
    let mut at = 0;
    let bytes = text.as_bytes();
    // Each step: skip whitespace, then expect what follows.
    let ws = |at: &mut usize| {
        while *at < bytes.len() && bytes[*at].is_ascii_whitespace() {
            *at += 1;
        }
        *at < bytes.len()
    };
    let expect = |at: &mut usize, b: u8| -> Option<bool> {
        if !ws(at) {
            return None;
        }
        let found = bytes[*at] == b;
        *at += 1;
        Some(found)
    };
    macro_rules! step {
        ($e:expr) => {
            match $e {
                None => return Head::Incomplete,
                Some(false) => return Head::No,
                Some(true) => {}
            }
        };
    }
    step!(expect(&mut at, b'{'));
    let key = match json_string(text, &mut at) {
        Err(head) => return head,
        Ok(key) => key,
    };
    if key != "name" {
        return Head::No;
    }
    step!(expect(&mut at, b':'));
    let name = match json_string(text, &mut at) {
        Err(head) => return head,
        Ok(name) => name,
    };
    step!(expect(&mut at, b','));
    let key = match json_string(text, &mut at) {
        Err(head) => return head,
        Ok(key) => key,
    };
    if key != "arguments" && key != "parameters" {
        return Head::No;
    }
    step!(expect(&mut at, b':'));
    step!(expect(&mut at, b'{'));
    Head::Yes {
        name,
        id: None,
        args: at - 1,
    }
}

/// A JSON string at `*at` (after whitespace), decoded; `Err` says why not.
fn json_string(text: &str, at: &mut usize) -> Result<String, Head> {
    let bytes = text.as_bytes();
    while *at < bytes.len() && bytes[*at].is_ascii_whitespace() {
        *at += 1;
    }
    match bytes.get(*at) {
        None => return Err(Head::Incomplete),
        Some(b'"') => {}
        Some(_) => return Err(Head::No),
    }
    let start = *at;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start + 1) {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => {
                *at = i + 1;
                return serde_json::from_str(&text[start..=i]).map_err(|_| Head::No);
            }
            _ => {}
        }
    }
    Err(Head::Incomplete)
}

/// Mistral's `name[ARGS]{` or `name[CALL_ID]id[ARGS]{` at the start of
/// `text` (its list form is read whole).
fn mistral_head(text: &str) -> Head {
    let rest = text.trim_start();
    if rest.starts_with('[') {
        return Head::No;
    }
    let Some(args) = rest.find("[ARGS]") else {
        return match rest.len() > 256 {
            true => Head::No,
            false => Head::Incomplete,
        };
    };
    let (name, id) = match rest[..args].split_once("[CALL_ID]") {
        Some((name, id)) => (name.trim(), Some(id.trim().to_string())),
        None => (rest[..args].trim(), None),
    };
    let after = &rest[args + "[ARGS]".len()..];
    let brace = after.len() - after.trim_start().len();
    match after.trim_start().chars().next() {
        None => Head::Incomplete,
        Some('{') if !name.is_empty() => Head::Yes {
            name: name.to_string(),
            id,
            args: text.len() - after.len() + brace,
        },
        Some(_) => Head::No,
    }
}
