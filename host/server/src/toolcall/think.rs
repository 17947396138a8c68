//! Reasoning split off an answer's text at `<think>` and `</think>`, as the
//! text streams (a marker may arrive split across chunks).

use super::partial_tail;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// One answer's reasoning splitter.
#[derive(Debug)]
pub(crate) struct Thinking {
    inside: bool,
    /// Text that may begin a marker, held back.
    held: String,
    /// Whether the current block (reasoning or answer) has shown text:
    /// whitespace at a block's start is the template's separator.
    started: bool,
}

impl Thinking {
    /// A splitter for an answer that starts inside the reasoning (the
    /// prompt opened `<think>`) or outside it.
    pub(crate) fn new(inside: bool) -> Thinking {
        Thinking {
            inside,
            held: String::new(),
            started: false,
        }
    }

    /// Takes `text`; appends `(is_reasoning, text)` pieces to `out`.
    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<(bool, String)>) {
        self.held.push_str(text);
        loop {
            // A model whose prompt opened the reasoning may still write
            // the opening marker itself.
            if self.inside && !self.started {
                let rest = self.held.trim_start();
                if rest.starts_with(OPEN) {
                    let cut = self.held.len() - rest.len() + OPEN.len();
                    self.held.drain(..cut);
                    continue;
                }
            }
            let marker = if self.inside { CLOSE } else { OPEN };
            match self.held.find(marker) {
                Some(at) => {
                    let before = self.held[..at].to_string();
                    self.held.drain(..at + marker.len());
                    self.emit(before, out);
                    self.inside = !self.inside;
                    self.started = false;
                }
                None => {
                    let keep = partial_tail(&self.held, &[OPEN, CLOSE]);
                    let now: String = self.held.drain(..self.held.len() - keep).collect();
                    self.emit(now, out);
                    return;
                }
            }
        }
    }

    /// The answer is over: what was held back is passed on.
    pub(crate) fn finish(&mut self, out: &mut Vec<(bool, String)>) {
        let rest = std::mem::take(&mut self.held);
        self.emit(rest, out);
    }

    fn emit(&mut self, text: String, out: &mut Vec<(bool, String)>) {
        let text = match self.started {
            true => text,
            false => text.trim_start().to_string(),
        };
        if text.is_empty() {
            return;
        }
        self.started = true;
        match out.last_mut() {
            Some((reasoning, last)) if *reasoning == self.inside => last.push_str(&text),
            _ => out.push((self.inside, text)),
        }
    }
}
