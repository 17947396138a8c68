//! A response's output items, built from the engine's pieces, and the
//! Responses API's events that tell a streaming client about them.
//!
//! Items open as their first piece comes and close when another kind
//! begins: reasoning, then the message, then function calls, as the model
//! wrote them. Each item's events run `response.output_item.added`, then
//! (reasoning and messages) `response.content_part.added`, the deltas,
//! their `.done`, `response.content_part.done`, or (function calls)
//! `response.function_call_arguments.delta`/`.done`, and
//! `response.output_item.done`. A stream begins with `response.created` and
//! `response.in_progress` and ends with `response.completed`,
//! `response.incomplete` (cut by `max_output_tokens`) or `response.failed`;
//! every event carries its `type` and a `sequence_number` from 0. The
//! whole (non-streamed) answer is built by the same code, its events
//! discarded, so both carry the same items.

use std::sync::Arc;

use serde_json::{json, Value};

use super::super::pieces::{self, Piece, Step, Translator};
use super::super::ApiError;
use super::store::Store;
use super::Ask;

/// The kind of the item open now (the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call,
}

/// The output items so far, and the events' sequence.
#[derive(Debug, Default)]
pub(super) struct Output {
    items: Vec<Value>,
    open: Option<Open>,
    sequence: u64,
}

impl Output {
    /// Writes one event (its `sequence_number` added).
    fn emit(&mut self, out: &mut String, mut data: Value) {
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push_str("event: ");
        out.push_str(data["type"].as_str().unwrap_or_default());
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    /// The open item's index and id.
    fn at(&self) -> (usize, Value) {
        let index = self.items.len().saturating_sub(1);
        let id = self
            .items
            .get(index)
            .map_or(Value::Null, |i| i["id"].clone());
        (index, id)
    }

    /// Opens an item of `kind` (closing another) unless one is open.
    fn open(&mut self, kind: Open, out: &mut String) {
        if self.open == Some(kind) {
            return;
        }
        self.close("completed", out);
        let unique = super::super::inprocess::unique();
        let (item, part) = match kind {
            Open::Message => (
                json!({ "type": "message", "id": format!("msg_{unique}"), "status": "in_progress",
                        "role": "assistant", "content": [] }),
                json!({ "type": "output_text", "text": "", "annotations": [] }),
            ),
            _ => (
                json!({ "type": "reasoning", "id": format!("rs_{unique}"), "status": "in_progress",
                        "summary": [], "content": [] }),
                json!({ "type": "reasoning_text", "text": "" }),
            ),
        };
        self.added(item, out);
        let (index, id) = self.at();
        self.items[index]["content"] = json!([part.clone()]);
        self.emit(
            out,
            json!({ "type": "response.content_part.added", "item_id": id, "output_index": index,
                    "content_index": 0, "part": part }),
        );
        self.open = Some(kind);
    }

    fn added(&mut self, item: Value, out: &mut String) {
        self.items.push(item.clone());
        let index = self.items.len() - 1;
        self.emit(
            out,
            json!({ "type": "response.output_item.added", "output_index": index, "item": item }),
        );
    }

    /// Ends the open item with `status` (`completed`, or `incomplete` when
    /// the answer was cut).
    pub(super) fn close(&mut self, status: &str, out: &mut String) {
        let Some(kind) = self.open.take() else {
            return;
        };
        let (index, id) = self.at();
        match kind {
            Open::Message | Open::Reasoning => {
                let part = self.items[index]["content"][0].clone();
                let text = part["text"].clone();
                let done = match kind {
                    Open::Message => json!({ "type": "response.output_text.done", "logprobs": [] }),
                    _ => json!({ "type": "response.reasoning_text.done" }),
                };
                let mut done = done;
                done["item_id"] = id.clone();
                done["output_index"] = json!(index);
                done["content_index"] = json!(0);
                done["text"] = text;
                self.emit(out, done);
                self.emit(
                    out,
                    json!({ "type": "response.content_part.done", "item_id": id, "output_index": index,
                            "content_index": 0, "part": part }),
                );
            }
            Open::Call => {
                if self.items[index]["arguments"] == "" {
                    self.items[index]["arguments"] = json!("{}");
                }
                let arguments = self.items[index]["arguments"].clone();
                self.emit(
                    out,
                    json!({ "type": "response.function_call_arguments.done", "item_id": id,
                            "output_index": index, "arguments": arguments }),
                );
            }
        }
        self.items[index]["status"] = json!(status);
        let item = self.items[index].clone();
        self.emit(
            out,
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        );
    }

    /// Appends `text` to the open item's first content part, and writes the
    /// delta event `kind`.
    fn text(&mut self, kind: &str, text: String, out: &mut String) {
        let (index, id) = self.at();
        if let Some(Value::String(s)) = self.items[index].pointer_mut("/content/0/text") {
            s.push_str(&text);
        }
        let mut delta = json!({ "type": kind, "item_id": id, "output_index": index,
                                "content_index": 0, "delta": text });
        if kind == "response.output_text.delta" {
            delta["logprobs"] = json!([]);
        }
        self.emit(out, delta);
    }

    /// Takes the next pieces of the answer.
    pub(super) fn pieces(&mut self, pieces: Vec<Piece>, out: &mut String) {
        for piece in pieces {
            match piece {
                Piece::Text(text) => {
                    self.open(Open::Message, out);
                    self.text("response.output_text.delta", text, out);
                }
                Piece::Thinking(text) => {
                    self.open(Open::Reasoning, out);
                    self.text("response.reasoning_text.delta", text, out);
                }
                Piece::ToolUse { id, name } => {
                    self.close("completed", out);
                    let item = json!({ "type": "function_call",
                                       "id": format!("fc_{}", super::super::inprocess::unique()),
                                       "call_id": id, "name": name, "arguments": "",
                                       "status": "in_progress" });
                    self.added(item, out);
                    self.open = Some(Open::Call);
                }
                Piece::Input(json) if self.open == Some(Open::Call) => {
                    let (index, id) = self.at();
                    if let Some(Value::String(s)) = self.items[index].get_mut("arguments") {
                        s.push_str(&json);
                    }
                    self.emit(
                        out,
                        json!({ "type": "response.function_call_arguments.delta", "item_id": id,
                                "output_index": index, "delta": json }),
                    );
                }
                Piece::Input(_) => {}
            }
        }
    }

    /// The items, once the answer is over.
    pub(super) fn items(&self) -> Vec<Value> {
        self.items.clone()
    }
}

/// A streamed response: the engine's events as the Responses API's.
pub(super) struct Streamed {
    ask: Ask,
    translator: Translator,
    output: Output,
    store: Arc<Store>,
    started: bool,
}

impl Streamed {
    pub(super) fn new(ask: Ask, translator: Translator, store: Arc<Store>) -> Streamed {
        Streamed {
            ask,
            translator,
            output: Output::default(),
            store,
            started: false,
        }
    }

    /// `response.created` and `response.in_progress`, once.
    fn start(&mut self, out: &mut String) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let response = self.ask.response("in_progress", vec![], Value::Null);
        for kind in ["response.created", "response.in_progress"] {
            self.output
                .emit(out, json!({ "type": kind, "response": response.clone() }));
        }
    }

    /// The last item's end, and `response.completed` or `.incomplete` with
    /// the whole response (stored, unless the request said not to).
    fn finish(&mut self, out: &mut String) {
        self.start(out);
        let held = self.translator.flush();
        self.output.pieces(held, out);
        let response = super::finished(&self.ask, &self.translator, &mut self.output, out);
        super::keep(&self.store, &self.ask, &response);
        let kind = match response["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        self.output
            .emit(out, json!({ "type": kind, "response": response }));
    }
}

impl pieces::Events for Streamed {
    fn event(&mut self, event: &[u8], out: &mut String) -> bool {
        self.start(out);
        match self.translator.event(event) {
            Step::Pieces(pieces) => {
                self.output.pieces(pieces, out);
                if self.translator.done {
                    self.finish(out);
                }
                self.translator.done
            }
            Step::Error(e) => {
                self.error(&e, out);
                true
            }
        }
    }

    fn end(&mut self, out: &mut String) {
        self.finish(out);
    }

    /// `response.failed`, with the items so far and the engine's error.
    fn error(&mut self, e: &ApiError, out: &mut String) {
        self.start(out);
        self.output.close("incomplete", out);
        let error = json!({ "code": "server_error", "message": e.message });
        let response = self.ask.response("failed", self.output.items(), error);
        self.output.emit(
            out,
            json!({ "type": "response.failed", "response": response }),
        );
    }
}
