//! Server-sent events passing through the proxy: framing an engine's byte
//! stream into events, and putting the client's model id into each one.
//!
//! This is the per-token path, so it works on bytes and copies little: the
//! framer scans each byte once (never the whole buffer again), complete
//! events leave as slices of what a read of the engine's socket brought
//! (every event in it, in one run), and an event's
//! top-level `"model"` string is replaced in place. Only an event whose
//! shape the in-place rewrite does not cover (a `model` that is not a
//! string, a line that is not one JSON object) goes through a full
//! `serde_json` parse, as every event once did.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use memchr::memmem;
use serde_json::Value;

/// Splits a byte stream into complete server-sent events (each ending in a
/// blank line: `\n\n` or `\r\n\r\n`), keeping an incomplete tail for the
/// next chunk.
#[derive(Default)]
pub(super) struct SseFramer {
    /// The start of an event whose end has not arrived yet.
    pending: BytesMut,
    /// How much of `pending` has been searched for an event's end.
    scanned: usize,
}

impl SseFramer {
    /// Takes the stream's next chunk and returns the events it completes as
    /// one contiguous run (empty when it completes none), with each event's
    /// end offset in that run in `ends`.
    ///
    /// A chunk that starts with no pending tail is not copied: the run is a
    /// slice of it.
    pub(super) fn push(&mut self, chunk: Bytes, ends: &mut Vec<usize>) -> Bytes {
        ends.clear();
        if self.pending.is_empty() {
            event_ends(&chunk, 0, ends);
            let last = ends.last().copied().unwrap_or(0);
            self.pending.extend_from_slice(&chunk[last..]);
            self.scanned = self.pending.len();
            return chunk.slice(..last);
        }
        self.pending.extend_from_slice(&chunk);
        event_ends(&self.pending, self.scanned, ends);
        let last = ends.last().copied().unwrap_or(0);
        let run = self.pending.split_to(last).freeze();
        self.scanned = self.pending.len();
        run
    }
}

/// Pushes the end offset of every event in `buffer` whose blank line ends
/// at or after `from` (the bytes before it were searched already, and hold
/// no complete event).
fn event_ends(buffer: &[u8], from: usize, ends: &mut Vec<usize>) {
    let mut start = 0;
    for i in memchr::memchr_iter(b'\n', &buffer[from..]).map(|i| i + from) {
        // A blank line inside this event: `\n\n`, or `\r\n\r\n`.
        let event = &buffer[start..=i];
        if event.ends_with(b"\n\n") || event.ends_with(b"\r\n\r\n") {
            ends.push(i + 1);
            start = i + 1;
        }
    }
}

/// A `200 text/event-stream` response whose body is `events`, polled by
/// hyper as the client's connection takes them.
pub(super) fn response(
    events: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .expect("a valid response")
}

/// Whether an answer with these headers is an event stream.
pub(super) fn is_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Whether `event` is the stream's `data: [DONE]` marker.
pub(super) fn is_done(event: &[u8]) -> bool {
    memmem::find(event, b"[DONE]").is_some()
        && event
            .split(|&b| b == b'\n')
            .any(|line| line.trim_ascii() == b"data: [DONE]")
}

/// The client's model id, JSON-encoded once per stream.
pub(super) struct ModelRewrite {
    /// `"id"`, quoted and escaped as in JSON.
    json: Vec<u8>,
    /// The id, for the full parse.
    id: String,
}

impl ModelRewrite {
    pub(super) fn new(model_id: &str) -> ModelRewrite {
        ModelRewrite {
            json: serde_json::to_vec(model_id).expect("a string serializes"),
            id: model_id.to_string(),
        }
    }

    /// Puts the client's model id into every JSON `data: ` line of the
    /// events of `run` (ending at `ends`) into `out`; returns `false`, with
    /// `out` left empty, when no event changes, so that the run can be
    /// forwarded as it is.
    pub(super) fn rewrite_run(&self, run: &[u8], ends: &[usize], out: &mut BytesMut) -> bool {
        out.clear();
        if memmem::find(run, b"\"model\"").is_none() {
            return false;
        }
        let mut changed = false;
        let mut start = 0;
        for &end in ends {
            changed |= self.rewrite_event(&run[start..end], out);
            start = end;
        }
        if !changed {
            out.clear();
        }
        changed
    }

    /// Appends `event` to `out` with the client's model id in every JSON
    /// `data: ` line; returns whether anything changed.
    pub(super) fn rewrite_event(&self, event: &[u8], out: &mut BytesMut) -> bool {
        let mut changed = false;
        for line in event.split_inclusive(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data: ") else {
                out.extend_from_slice(line);
                continue;
            };
            let json = data.trim_ascii_end();
            let newline = &data[json.len()..];
            match top_level_model(json) {
                Shape::NoModel => out.extend_from_slice(line),
                Shape::ModelString(span) if json[span.clone()] == self.json[..] => {
                    out.extend_from_slice(line)
                }
                Shape::ModelString(span) => {
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(&json[..span.start]);
                    out.extend_from_slice(&self.json);
                    out.extend_from_slice(&json[span.end..]);
                    out.extend_from_slice(newline);
                    changed = true;
                }
                Shape::Other => match self.reparse(json) {
                    Some(rewritten) => {
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(&rewritten);
                        out.extend_from_slice(b"\n");
                        changed = true;
                    }
                    None => out.extend_from_slice(line),
                },
            }
        }
        changed
    }

    /// The full parse-and-serialise, for shapes the in-place rewrite does
    /// not cover; `None` when the line is not JSON or has no `model`.
    fn reparse(&self, json: &[u8]) -> Option<Vec<u8>> {
        let mut value: Value = serde_json::from_slice(json).ok()?;
        let model = value.get_mut("model")?;
        *model = Value::String(self.id.clone());
        serde_json::to_vec(&value).ok()
    }
}

/// What [`top_level_model`] found in a `data:` line.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// A JSON object with no top-level `model` key.
    NoModel,
    /// A JSON object whose one top-level `model` is the string at this span
    /// (quotes included).
    ModelString(std::ops::Range<usize>),
    /// Anything else: not an object, a `model` that is not a string, a key
    /// spelled with escapes, `model` twice, or malformed JSON.
    Other,
}

/// Walks the top level of the JSON object in `json` (skipping nested
/// values without parsing them) to find its `model` string.
fn top_level_model(json: &[u8]) -> Shape {
    let mut at = skip_ws(json, 0);
    if json.get(at) != Some(&b'{') {
        return Shape::Other;
    }
    at = skip_ws(json, at + 1);
    let mut model = None;
    if json.get(at) == Some(&b'}') {
        at += 1;
    } else {
        loop {
            let Some(key_end) = string_end(json, at) else {
                return Shape::Other;
            };
            let key = &json[at + 1..key_end - 1];
            if key.contains(&b'\\') {
                return Shape::Other;
            }
            at = skip_ws(json, key_end);
            if json.get(at) != Some(&b':') {
                return Shape::Other;
            }
            at = skip_ws(json, at + 1);
            let Some(value_end) = value_end(json, at) else {
                return Shape::Other;
            };
            if key == b"model" {
                if model.is_some() || json[at] != b'"' {
                    return Shape::Other;
                }
                model = Some(at..value_end);
            }
            at = skip_ws(json, value_end);
            match json.get(at) {
                Some(b',') => at = skip_ws(json, at + 1),
                Some(b'}') => {
                    at += 1;
                    break;
                }
                _ => return Shape::Other,
            }
        }
    }
    if skip_ws(json, at) != json.len() {
        return Shape::Other;
    }
    match model {
        Some(span) => Shape::ModelString(span),
        None => Shape::NoModel,
    }
}

fn skip_ws(json: &[u8], mut at: usize) -> usize {
    while json
        .get(at)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        at += 1;
    }
    at
}

/// The end (past the closing quote) of the string starting at `at`.
fn string_end(json: &[u8], at: usize) -> Option<usize> {
    if json.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', &json[i..])?;
        match json[i] {
            b'\\' => i += 2,
            _ => return Some(i + 1),
        }
    }
}

/// The end of the JSON value starting at `at`: strings, objects and arrays
/// are matched, scalars run to the next delimiter.
fn value_end(json: &[u8], at: usize) -> Option<usize> {
    match *json.get(at)? {
        b'"' => string_end(json, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match *json.get(i)? {
                    b'"' => {
                        i = string_end(json, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let len = json[at..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(json.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    /// Feeds `chunks` (separated by `|`) through the framer, rewrites each
    /// run for model `tiny`, and renders what leaves: one line per run,
    /// `=` when forwarded untouched, `~` when rewritten, with `[DONE]`
    /// marked where it was seen.
    fn check(chunks: &str, expected: Expect) {
        let rewrite = ModelRewrite::new("tiny");
        let mut framer = SseFramer::default();
        let mut ends = Vec::new();
        let mut out = String::new();
        for chunk in chunks.split('|') {
            let run = framer.push(Bytes::from(chunk.to_string()), &mut ends);
            if run.is_empty() {
                out.push_str("(nothing)\n");
                continue;
            }
            let mut rewritten = BytesMut::new();
            let changed = rewrite.rewrite_run(&run, &ends, &mut rewritten);
            let sent = if changed { &rewritten[..] } else { &run[..] };
            let done = ends
                .iter()
                .scan(0, |start, &end| {
                    let event = &run[*start..end];
                    *start = end;
                    Some(is_done(event))
                })
                .any(|d| d);
            let mark = if changed { '~' } else { '=' };
            let text = String::from_utf8_lossy(sent)
                .replace('\r', "\\r")
                .replace('\n', "\\n");
            out.push_str(&format!(
                "{mark} {} event(s){}: {text}\n",
                ends.len(),
                if done { " DONE" } else { "" }
            ));
        }
        expected.assert_eq(&out);
    }

    #[test]
    fn events_split_across_chunks_are_joined() {
        check(
            "data: {\"model\":\"/tmp/x\",\"a\"|:1}\n\n|data: [DO|NE]\n\n",
            expect![[r#"
                (nothing)
                ~ 1 event(s): data: {"model":"tiny","a":1}\n\n
                (nothing)
                = 1 event(s) DONE: data: [DONE]\n\n
            "#]],
        );
    }

    #[test]
    fn a_blank_line_split_between_chunks_ends_the_event() {
        check(
            "data: {\"x\":1}\n|\ndata: {\"x\":2}\r\n\r|\n",
            expect![[r#"
                (nothing)
                = 1 event(s): data: {"x":1}\n\n
                = 1 event(s): data: {"x":2}\r\n\r\n
            "#]],
        );
    }

    #[test]
    fn several_events_in_one_chunk_leave_as_one_run() {
        check(
            ": keepalive\n\ndata: {\"model\":\"m\",\"n\":1}\n\ndata: {\"model\":\"m\",\"n\":2}\n\ndata: {\"mod",
            expect![[r#"
                ~ 3 event(s): : keepalive\n\ndata: {"model":"tiny","n":1}\n\ndata: {"model":"tiny","n":2}\n\n
            "#]],
        );
    }

    #[test]
    fn crlf_events_keep_their_line_endings() {
        check(
            "event: chunk\r\ndata: {\"model\": \"m\", \"n\": 1}\r\n\r\n",
            expect![[r#"
                ~ 1 event(s): event: chunk\r\ndata: {"model": "tiny", "n": 1}\r\n\r\n
            "#]],
        );
    }

    #[test]
    fn comments_and_events_without_model_pass_untouched() {
        check(
            ": ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"\\\"model\\\"\"}}]}\n\n",
            expect![[r#"
                = 2 event(s): : ping\n\ndata: {"choices":[{"delta":{"content":"\"model\""}}]}\n\n
            "#]],
        );
    }

    #[test]
    fn only_the_top_level_model_is_rewritten() {
        check(
            concat!(
                r#"data: {"choices":[{"model":"inner","text":"}{"}],"usage":{"model":1},"model":"outer"}"#,
                "\n\n"
            ),
            expect![[r#"
                ~ 1 event(s): data: {"choices":[{"model":"inner","text":"}{"}],"usage":{"model":1},"model":"tiny"}\n\n
            "#]],
        );
    }

    #[test]
    fn model_strings_with_escapes_are_replaced_whole() {
        check(
            concat!(
                r#"data: {"model":"a\"b\\c\u00e9","x":[1,2.5e3,true,null]}"#,
                "\n\n"
            ),
            expect![[r#"
                ~ 1 event(s): data: {"model":"tiny","x":[1,2.5e3,true,null]}\n\n
            "#]],
        );
    }

    #[test]
    fn a_client_model_id_that_needs_escaping_is_escaped() {
        let rewrite = ModelRewrite::new("org/\"q\"\\m");
        let mut out = BytesMut::new();
        assert!(rewrite.rewrite_event(b"data: {\"model\":\"x\"}\n\n", &mut out));
        assert_eq!(&out[..], br#"data: {"model":"org/\"q\"\\m"}"#.iter().chain(b"\n\n").copied().collect::<Vec<u8>>());
    }

    #[test]
    fn an_event_already_naming_the_client_model_is_forwarded_as_is() {
        check(
            "data: {\"model\":\"tiny\"}\n\n",
            expect![[r#"
                = 1 event(s): data: {"model":"tiny"}\n\n
            "#]],
        );
    }

    #[test]
    fn shapes_the_in_place_rewrite_does_not_cover_take_the_full_parse() {
        // A non-string model, an escaped key, and a model given twice are
        // rewritten by serde_json (which re-serialises with sorted keys);
        // lines that are not JSON pass unchanged.
        check(
            r#"data: {"z":1,"model":null}
data: {"z":1,"mod\u0065l":"m"}
data: {"model":"a","model":"b"}
data: {"model":"m", oops}
data: ["model"]

"#,
            expect![[r#"
                ~ 1 event(s): data: {"model":"tiny","z":1}\ndata: {"model":"tiny","z":1}\ndata: {"model":"tiny"}\ndata: {"model":"m", oops}\ndata: ["model"]\n\n
            "#]],
        );
    }

    #[test]
    fn top_level_model_finds_the_span() {
        let span = |json: &str| match top_level_model(json.as_bytes()) {
            Shape::ModelString(r) => json[r].to_string(),
            other => format!("{other:?}"),
        };
        assert_eq!(span(r#" { "model" : "a" } "#), r#""a""#);
        assert_eq!(span("{}"), "NoModel");
        assert_eq!(span(r#"{"a":{"model":"x"}}"#), "NoModel");
        assert_eq!(span(r#"{"a":1} x"#), "Other");
        assert_eq!(span(r#"{"a":"#), "Other");
        assert_eq!(span(r#"{"a":"unterminated}"#), "Other");
    }
}
