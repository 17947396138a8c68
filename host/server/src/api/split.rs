//! Engine answers split into text, reasoning and tool calls, in OpenAI's
//! shapes, whichever engine wrote them.
//!
//! An answer whose request has tools, or whose model's template marks
//! reasoning, goes through here on its way to the client (every other
//! answer passes untouched): a whole answer's `message.content` becomes
//! `content`, `reasoning_content` and `tool_calls` (with `finish_reason`
//! `"tool_calls"`); a stream's `delta.content` becomes deltas of the same
//! three, tool calls as OpenAI streams them (index, id and name first,
//! then the arguments). Where the engine parsed calls or reasoning itself
//! (`tool_calls`, `reasoning_content` or `reasoning` in its answer), they
//! pass as the engine wrote them, `reasoning` renamed `reasoning_content`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::sse::{self, SseFramer};
use super::tools::Ask;
use crate::toolcall::{ChatTraits, Delta, Format, Parser, Splitter};

/// How to read one request's answer.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    traits: ChatTraits,
    format: Option<Format>,
    tools: Vec<Value>,
    parallel: bool,
}

impl Plan {
    /// The plan for a model with `traits` whose calls are in `format` (none:
    /// no tools, or a markup the host cannot parse).
    pub(super) fn new(traits: ChatTraits, format: Option<Format>, ask: &Ask) -> Plan {
        Plan {
            traits,
            format,
            tools: ask.tools.clone(),
            parallel: ask.parallel,
        }
    }

    /// Whether the answer needs splitting at all.
    pub(super) fn is_active(&self) -> bool {
        self.traits.thinks || self.format.is_some()
    }

    fn splitter(&self, parse_calls: bool) -> Splitter {
        let prefix = super::inprocess::unique();
        let parser = self
            .format
            .filter(|_| parse_calls)
            .map(|f| Parser::new(f, &self.tools, &prefix));
        Splitter::new(&self.traits, parser)
    }

    /// Whether a call of this index is passed on (`parallel_tool_calls:
    /// false` keeps the first).
    fn keeps(&self, index: usize) -> bool {
        self.parallel || index == 0
    }

    /// A stream delta's fields for one piece of the answer (`None`: a call
    /// `parallel_tool_calls: false` drops).
    fn piece(&self, delta: Delta) -> Option<Value> {
        Some(match delta {
            Delta::Text(t) => json!({ "content": t }),
            Delta::Reasoning(t) => json!({ "reasoning_content": t }),
            Delta::Call { index, id, name } if self.keeps(index) => json!({
                "tool_calls": [{ "index": index, "id": id, "type": "function",
                                 "function": { "name": name, "arguments": "" } }],
            }),
            Delta::Args { index, fragment } if self.keeps(index) => json!({
                "tool_calls": [{ "index": index, "function": { "arguments": fragment } }],
            }),
            Delta::Call { .. } | Delta::Args { .. } => return None,
        })
    }
}

/// The engine's answer (as the proxy got it) read with `plan`.
pub(super) async fn apply(response: Response, plan: Plan) -> Response {
    if !response.status().is_success() {
        return response;
    }
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse {
        return stream(response, plan);
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return super::ApiError::engine(format!("the engine's answer broke off: {e}"))
                .into_response()
        }
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    for choice in value
        .get_mut("choices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        whole_choice(&plan, choice);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(value.to_string()))
}

/// Splits one choice of a whole answer.
fn whole_choice(plan: &Plan, choice: &mut Value) {
    let Some(message) = choice.get_mut("message").and_then(Value::as_object_mut) else {
        return;
    };
    rename_reasoning(message);
    let engine_calls = has_calls(message);
    let mut next = 0;
    normalize_calls(message, &mut next);
    // A whole message's calls carry no stream index.
    for call in message
        .get_mut("tool_calls")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        call.remove("index");
    }
    let mut splitter = plan.splitter(!engine_calls);
    if message
        .get("reasoning_content")
        .is_some_and(|r| !r.is_null())
    {
        splitter.engine_thinks();
    }
    let mut deltas = Vec::new();
    if let Some(content) = message.get("content").and_then(Value::as_str) {
        splitter.push(content, &mut deltas);
        splitter.finish(&mut deltas);
    }
    let (mut text, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<Value> = Vec::new();
    for delta in deltas {
        match delta {
            Delta::Text(t) => text.push_str(&t),
            Delta::Reasoning(t) => reasoning.push_str(&t),
            Delta::Call { index, id, name } if plan.keeps(index) => calls.push(json!({
                "id": id, "type": "function", "function": { "name": name, "arguments": "" },
            })),
            Delta::Args { index, fragment } if plan.keeps(index) => {
                if let Some(Value::String(args)) = calls
                    .get_mut(index)
                    .and_then(|c| c.pointer_mut("/function/arguments"))
                {
                    args.push_str(&fragment);
                }
            }
            Delta::Call { .. } | Delta::Args { .. } => {}
        }
    }
    if message.get("content").is_some_and(Value::is_string) {
        let content = match text.is_empty() && !calls.is_empty() {
            true => Value::Null,
            false => Value::String(text),
        };
        message.insert("content".into(), content);
    }
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), Value::String(reasoning));
    }
    let called = engine_calls || !calls.is_empty();
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    if called && choice.get("finish_reason").and_then(Value::as_str) == Some("stop") {
        choice["finish_reason"] = json!("tool_calls");
    }
}

/// `reasoning` (mlx_lm.server, vLLM) becomes `reasoning_content`.
fn rename_reasoning(fields: &mut Map<String, Value>) {
    if let Some(reasoning) = fields.remove("reasoning") {
        fields.entry("reasoning_content").or_insert(reasoning);
    }
}

/// An engine's own tool calls in OpenAI's exact shape: every call with an
/// `index` (in order, where the engine gave none), a new call with an `id`
/// and `type`, arguments as JSON text (some engines send an object).
/// `next` is the index the next new call gets.
fn normalize_calls(fields: &mut Map<String, Value>, next: &mut usize) {
    let Some(Value::Array(calls)) = fields.get_mut("tool_calls") else {
        return;
    };
    for call in calls.iter_mut().filter_map(Value::as_object_mut) {
        let starts = call.contains_key("id")
            || call
                .get("function")
                .is_some_and(|f| f.get("name").is_some_and(Value::is_string));
        let index = match call.get("index").and_then(Value::as_u64) {
            Some(i) => i as usize,
            None if starts => *next,
            None => next.saturating_sub(1),
        };
        *next = (*next).max(index + 1);
        call.insert("index".into(), json!(index));
        if starts {
            call.entry("type").or_insert_with(|| json!("function"));
            if !call.get("id").is_some_and(Value::is_string) {
                let id = format!("call_{}_{index}", super::inprocess::unique());
                call.insert("id".into(), json!(id));
            }
        }
        if let Some(Value::Object(function)) = call.get_mut("function") {
            if let Some(args) = function.get_mut("arguments").filter(|a| !a.is_string()) {
                *args = match args.is_null() {
                    true => json!(""),
                    false => json!(args.to_string()),
                };
            }
        }
    }
}

fn has_calls(fields: &Map<String, Value>) -> bool {
    fields
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
}

/// One choice of a stream, as read so far.
struct Choice {
    splitter: Splitter,
    /// Whether the engine sent tool calls of its own.
    engine_calls: bool,
    /// The index the engine's next new call gets.
    next_call: usize,
    /// Whether the choice's end came.
    finished: bool,
}

/// The stream's reader.
struct Stream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    framer: SseFramer,
    ends: Vec<usize>,
    plan: Plan,
    choices: Vec<Option<Choice>>,
    /// The last chunk's fields but `choices`, for the closing deltas of a
    /// stream that ends without a finish.
    last: Map<String, Value>,
    finished: bool,
}

fn stream(response: Response, plan: Plan) -> Response {
    let state = Stream {
        body: Box::pin(response.into_body().into_data_stream()),
        framer: SseFramer::default(),
        ends: Vec::new(),
        plan,
        choices: Vec::new(),
        last: Map::new(),
        finished: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let next = s.next().await?;
        Some((Ok::<_, Infallible>(next), s))
    });
    sse::response(events)
}

impl Stream {
    async fn next(&mut self) -> Option<Bytes> {
        let mut out = String::new();
        while !self.finished && out.is_empty() {
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    let mut ends = std::mem::take(&mut self.ends);
                    let run = self.framer.push(chunk, &mut ends);
                    let mut start = 0;
                    for &end in &ends {
                        self.event(&run[start..end], &mut out);
                        start = end;
                    }
                    self.ends = ends;
                }
                // The proxy ends a failed stream with its own error event.
                Some(Err(_)) | None => {
                    self.flush(&mut out);
                    self.finished = true;
                }
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// Passes one event on, split.
    fn event(&mut self, event: &[u8], out: &mut String) {
        let pass = |out: &mut String| out.push_str(&String::from_utf8_lossy(event));
        if sse::is_done(event) {
            self.flush(out);
            return pass(out);
        }
        let data: Vec<&[u8]> = event
            .split(|&b| b == b'\n')
            .filter_map(|line| line.trim_ascii().strip_prefix(b"data:"))
            .collect();
        let Ok(Value::Object(mut chunk)) = serde_json::from_slice::<Value>(&data.concat()) else {
            return pass(out);
        };
        let choices = match chunk.remove("choices") {
            Some(Value::Array(choices)) if !choices.is_empty() => choices,
            Some(other) => {
                chunk.insert("choices".into(), other);
                return pass(out);
            }
            None => return pass(out),
        };
        self.last.clone_from(&chunk);
        // An event of one choice may pass as it came (see `choice`).
        let raw = (choices.len() == 1).then_some(event);
        for choice in choices {
            self.choice(&chunk, choice, raw, out);
        }
    }

    /// Splits one choice of a chunk into the chunks the client gets. Plain
    /// text that the splitter passes on whole, in an event of this choice
    /// alone (`raw`), goes on as the engine's own event: most of a stream's
    /// events cost a parse, not a parse and a rewrite.
    fn choice(
        &mut self,
        base: &Map<String, Value>,
        mut choice: Value,
        raw: Option<&[u8]>,
        out: &mut String,
    ) {
        let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let finish = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut delta = match choice.get_mut("delta").map(Value::take) {
            Some(Value::Object(delta)) => delta,
            _ => Map::new(),
        };
        rename_reasoning(&mut delta);
        if self.choices.len() <= index {
            self.choices.resize_with(index + 1, || None);
        }
        let plan = &self.plan;
        let state = self.choices[index].get_or_insert_with(|| Choice {
            splitter: plan.splitter(true),
            engine_calls: false,
            next_call: 0,
            finished: false,
        });
        if delta.get("reasoning_content").is_some_and(|r| !r.is_null()) {
            state.splitter.engine_thinks();
        }
        state.engine_calls |= has_calls(&delta);
        normalize_calls(&mut delta, &mut state.next_call);
        let mut deltas = Vec::new();
        if let Some(Value::String(text)) = delta.remove("content") {
            state.splitter.push(&text, &mut deltas);
            let unchanged = matches!(deltas.as_slice(), [Delta::Text(t)] if *t == text);
            if let Some(raw) = raw.filter(|_| unchanged && delta.is_empty() && finish.is_none()) {
                out.push_str(&String::from_utf8_lossy(raw));
                return;
            }
        }
        if finish.is_some() {
            state.splitter.finish(&mut deltas);
            state.finished = true;
        }
        let called = state.engine_calls || state.splitter.calls() > 0;
        // What the engine's delta still holds (its role, its own calls or
        // reasoning) goes first, as it came.
        let role = delta.contains_key("role");
        if !delta.is_empty() {
            write(out, base, index, Value::Object(delta), None);
        }
        let mut first = !role;
        for d in deltas {
            let Some(mut piece) = self.plan.piece(d) else {
                continue;
            };
            if std::mem::take(&mut first) && role {
                piece["role"] = json!("assistant");
            }
            write(out, base, index, piece, None);
        }
        if let Some(reason) = finish {
            let reason = match reason.as_str() {
                "stop" if called => "tool_calls".to_string(),
                _ => reason,
            };
            write(out, base, index, json!({}), Some(&reason));
        }
    }

    /// The stream ended: what the splitters hold comes out.
    fn flush(&mut self, out: &mut String) {
        let base = self.last.clone();
        for (index, state) in self.choices.iter_mut().enumerate() {
            let Some(state) = state.as_mut().filter(|s| !s.finished) else {
                continue;
            };
            state.finished = true;
            let mut deltas = Vec::new();
            state.splitter.finish(&mut deltas);
            for piece in deltas.into_iter().filter_map(|d| self.plan.piece(d)) {
                write(out, &base, index, piece, None);
            }
        }
    }
}

/// Writes one chunk: `base`'s fields with one choice (and its usage, if
/// any, on the finishing chunk alone).
fn write(
    out: &mut String,
    base: &Map<String, Value>,
    index: usize,
    delta: Value,
    finish: Option<&str>,
) {
    let mut chunk = base.clone();
    if finish.is_none() {
        chunk.remove("usage");
    }
    chunk.insert(
        "choices".into(),
        json!([{ "index": index, "delta": delta, "finish_reason": finish }]),
    );
    out.push_str("data: ");
    out.push_str(&Value::Object(chunk).to_string());
    out.push_str("\n\n");
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;
    use crate::api::tools;

    /// A plan for a request with one tool, on a model whose template
    /// takes tools in Hermes markup (and thinks, when `thinks`).
    fn plan(thinks: bool) -> Plan {
        let template = match thinks {
            true => "{% if tools %}<tool_call>{% endif %}<think></think>",
            false => "{% if tools %}<tool_call>{% endif %}",
        };
        let request =
            json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]});
        let ask = tools::read(request.as_object().unwrap()).unwrap();
        Plan::new(
            ChatTraits::of_template(template),
            Some(Format::Hermes),
            &ask,
        )
    }

    /// Splits a whole answer's `choice` and renders it with ids masked.
    fn check_whole(thinks: bool, choice: Value, expect: Expect) {
        let mut choice = choice;
        whole_choice(&plan(thinks), &mut choice);
        expect.assert_eq(&mask(&choice.to_string()));
    }

    /// Splits a stream of engine chunks (each a `delta` and a finish
    /// reason) and renders the chunks the client gets, one per line.
    fn check_stream(thinks: bool, chunks: &[(Value, Option<&str>)], expect: Expect) {
        let mut stream = Stream {
            body: Box::pin(futures_util::stream::empty()),
            framer: SseFramer::default(),
            ends: Vec::new(),
            plan: plan(thinks),
            choices: Vec::new(),
            last: Map::new(),
            finished: false,
        };
        let mut out = String::new();
        for (delta, finish) in chunks {
            let chunk = json!({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            stream.event(format!("data: {chunk}\n\n").as_bytes(), &mut out);
        }
        stream.event(b"data: [DONE]\n\n", &mut out);
        let lines: Vec<String> = out
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or(json!(l));
                match v.pointer("/choices/0") {
                    Some(c) => format!("{} {}", c["delta"], c["finish_reason"]),
                    None => v.to_string(),
                }
            })
            .collect();
        expect.assert_eq(&mask(&lines.join("\n")));
    }

    /// Call ids hold the time: masked for snapshots.
    fn mask(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("call_") {
            out.push_str(&rest[..at + 5]);
            rest = &rest[at + 5..];
            let end = rest.find('_').unwrap_or(0);
            out.push_str("ID");
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn a_whole_answer_becomes_content_reasoning_and_calls() {
        check_whole(
            true,
            json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                "content": "<think>why</think>Sure.<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>"}}),
            expect![[
                r#"{"finish_reason":"tool_calls","index":0,"message":{"content":"Sure.","reasoning_content":"why","role":"assistant","tool_calls":[{"function":{"arguments":"{\"a\": 1}","name":"f"},"id":"call_ID_0","type":"function"}]}}"#
            ]],
        );
        // The engine's own calls: put in OpenAI's shape, never parsed again.
        check_whole(
            false,
            json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "",
                "reasoning": "hmm", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}}),
            expect![[
                r#"{"finish_reason":"tool_calls","index":0,"message":{"content":"","reasoning_content":"hmm","role":"assistant","tool_calls":[{"function":{"arguments":"{\"a\":1}","name":"f"},"id":"call_ID_0","type":"function"}]}}"#
            ]],
        );
    }

    #[test]
    fn a_stream_becomes_content_reasoning_and_call_deltas() {
        check_stream(
            true,
            &[
                (json!({"role": "assistant", "content": "<thi"}), None),
                (json!({"content": "nk>why</think>Sure.<tool_"}), None),
                (
                    json!({"content": "call>{\"name\": \"f\", \"arguments\": {\"a\""}),
                    None,
                ),
                (json!({"content": ": 1}}</tool_call>"}), None),
                (json!({}), Some("stop")),
            ],
            expect![[r#"
                {"role":"assistant"} null
                {"reasoning_content":"why"} null
                {"content":"Sure."} null
                {"tool_calls":[{"function":{"arguments":"","name":"f"},"id":"call_ID_0","index":0,"type":"function"}]} null
                {"tool_calls":[{"function":{"arguments":"{\"a\""},"index":0}]} null
                {"tool_calls":[{"function":{"arguments":": 1}"},"index":0}]} null
                {} "tool_calls"
                "[DONE]""#]],
        );
        // The engine's own calls and reasoning pass on, indexed and named.
        check_stream(
            false,
            &[
                (json!({"role": "assistant", "reasoning": "hmm"}), None),
                (
                    json!({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": ""}}]}),
                    None,
                ),
                (
                    json!({"tool_calls": [{"function": {"arguments": "{}"}}]}),
                    None,
                ),
                (json!({}), Some("tool_calls")),
            ],
            expect![[r#"
                {"reasoning_content":"hmm","role":"assistant"} null
                {"tool_calls":[{"function":{"arguments":"","name":"f"},"id":"c1","index":0,"type":"function"}]} null
                {"tool_calls":[{"function":{"arguments":"{}"},"index":0}]} null
                {} "tool_calls"
                "[DONE]""#]],
        );
    }
}
