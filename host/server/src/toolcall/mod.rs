//! Tool calls and reasoning as models write them, turned into one shape
//! by the host, whatever engine generated the text.
//!
//! Every chat model writes its tool calls in its own markup (Hermes and
//! Qwen's `<tool_call>{json}</tool_call>`, Llama 3's bare JSON object,
//! Mistral's `[TOOL_CALLS]`, Qwen3.5's `<function=…><parameter=…>` XML,
//! Gemma's `<start_function_call>`), and thinking models wrap their
//! reasoning in `<think>…</think>`. Engines differ in whether they parse
//! any of it, so the host does it once, here, for every engine: the API
//! feeds each answer's text through a [`Splitter`] and gets back text,
//! reasoning and tool-call deltas, the same for OpenAI's and Anthropic's
//! routes.
//!
//! Which markup applies is read from the model's chat template when the
//! catalog scans it ([`ChatTraits::of_template`]); an operator can name
//! another with the model setting `tool_parser`, and a plugin whose models
//! carry no template it can read declares one with `tool_parser` in its
//! manifest.
//!
//! The parsing lives in the server, not the engine library: it serves the
//! HTTP API's answers, and plugins never run it (they pass raw text or
//! engine-parsed calls; a plugin declares a format by name).

mod grammar;
mod parse;
mod think;

#[cfg(test)]
mod tests;

pub(crate) use grammar::{lark, Forced};
pub(crate) use parse::Parser;
pub(crate) use think::Thinking;

/// A tool-call markup the host can parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Hermes and Qwen 2.5/3: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Hermes,
    /// Llama 3.1+ JSON: the answer is `{"name": …, "parameters": {…}}`
    /// (after `<|python_tag|>`, or alone), several joined by `;`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}]`, or the newer
    /// `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// Qwen3-Coder and Qwen3.5: `<tool_call><function=name><parameter=p>v</parameter></function></tool_call>`.
    QwenXml,
    /// Gemma (FunctionGemma): `<start_function_call>call:name{k:<escape>v<escape>}<end_function_call>`.
    Gemma,
}

impl Format {
    /// Every format, in the order templates are matched against them.
    pub(crate) const ALL: [Format; 5] = [
        Format::Gemma,
        Format::QwenXml,
        Format::Hermes,
        Format::Mistral,
        Format::Llama3,
    ];

    /// The name operators and manifests use (`tool_parser = "hermes"`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Hermes => "hermes",
            Format::Llama3 => "llama3_json",
            Format::Mistral => "mistral",
            Format::QwenXml => "qwen3_xml",
            Format::Gemma => "gemma",
        }
    }

    /// The format called `name`.
    pub(crate) fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Every name, for error messages and the settings schema.
    pub(crate) fn names() -> Vec<&'static str> {
        Format::ALL.iter().map(|f| f.name()).collect()
    }

    /// Whether a chat template writes (and so teaches the model) this
    /// markup.
    fn in_template(self, template: &str) -> bool {
        match self {
            Format::Gemma => template.contains("<start_function_call>"),
            Format::QwenXml => template.contains("<function=") && template.contains("<parameter="),
            Format::Hermes => template.contains("<tool_call>"),
            Format::Mistral => template.contains("[TOOL_CALLS]"),
            // Llama 3.1's template asks for `{"name": function name,
            // "parameters": dictionary of argument name and its value}`.
            Format::Llama3 => {
                template.contains("<|python_tag|>")
                    || (template.contains("\"parameters\": dictionary")
                        && template.contains("<|eot_id|>"))
            }
        }
    }
}

/// What a model's chat template says about tools and reasoning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChatTraits {
    /// Whether a template was found at all (`false`: nothing is known, and
    /// nothing is refused on its account).
    pub known: bool,
    /// Whether the template renders `tools`.
    pub takes_tools: bool,
    /// The markup the template teaches, if the host knows it.
    pub format: Option<Format>,
    /// Whether the template marks reasoning with `<think>…</think>`.
    pub thinks: bool,
    /// Whether the generation prompt already opens `<think>`, so that the
    /// answer starts inside the reasoning (DeepSeek-R1, QwQ, Qwen3.5).
    pub starts_thinking: bool,
}

impl ChatTraits {
    /// The traits of a chat template's text (several templates of one
    /// model, such as `default` and `tool_use`, joined).
    pub(crate) fn of_template(template: &str) -> ChatTraits {
        let thinks = template.contains("<think>") && template.contains("</think>");
        // What the template writes once the prompt is done: a `<think>`
        // there that it does not close (Qwen3's closed, empty block turns
        // thinking off) means the model continues inside it.
        let tail = template
            .rfind("add_generation_prompt")
            .map_or("", |at| &template[at..]);
        let starts_thinking =
            thinks && tail.matches("<think>").count() > tail.matches("</think>").count();
        ChatTraits {
            known: true,
            takes_tools: mentions_word(template, "tools"),
            format: Format::ALL.into_iter().find(|f| f.in_template(template)),
            thinks,
            starts_thinking,
        }
    }
}

/// Whether `text` has `word` with no identifier character either side.
fn mentions_word(text: &str, word: &str) -> bool {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(word).any(|(at, _)| {
        !ident(text[..at].chars().next_back()) && !ident(text[at + word.len()..].chars().next())
    })
}

/// One piece of a parsed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delta {
    /// Answer text.
    Text(String),
    /// Reasoning text (inside `<think>`).
    Reasoning(String),
    /// A tool call begins: its index among the answer's calls, id and name.
    Call {
        /// 0 for the answer's first call.
        index: usize,
        /// `call_…`, unique within the host's life.
        id: String,
        /// The function's name.
        name: String,
    },
    /// A fragment of the arguments (JSON text) of call `index`.
    Args {
        /// The call.
        index: usize,
        /// The next piece of the arguments' JSON.
        fragment: String,
    },
}

/// One answer's text, split into reasoning, text and tool calls as it
/// streams: reasoning first (when the template thinks), then tool calls
/// in what is not reasoning (when the request has tools).
pub(crate) struct Splitter {
    thinking: Option<Thinking>,
    tools: Option<Parser>,
    pieces: Vec<(bool, String)>,
}

impl Splitter {
    /// A splitter for a model with `traits`, parsing tool calls in
    /// `format` (none: text stays text).
    pub(crate) fn new(traits: &ChatTraits, tools: Option<Parser>) -> Splitter {
        Splitter {
            thinking: traits.thinks.then(|| Thinking::new(traits.starts_thinking)),
            tools,
            pieces: Vec::new(),
        }
    }

    /// The engine split reasoning off itself: what comes is answer text
    /// (and what was held back as a possible marker is passed on as such).
    pub(crate) fn engine_thinks(&mut self) {
        if let Some(mut thinking) = self.thinking.take() {
            let mut held = Vec::new();
            thinking.finish(&mut held);
            self.pieces
                .extend(held.into_iter().map(|(_, text)| (false, text)));
        }
    }

    /// Takes the next piece of the answer's text.
    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        match &mut self.thinking {
            Some(thinking) => thinking.push(text, &mut self.pieces),
            None => self.pieces.push((false, text.to_string())),
        }
        self.route(out);
    }

    /// The answer is over: everything held back comes out.
    pub(crate) fn finish(&mut self, out: &mut Vec<Delta>) {
        if let Some(thinking) = &mut self.thinking {
            thinking.finish(&mut self.pieces);
        }
        self.route(out);
        if let Some(tools) = &mut self.tools {
            tools.finish(out);
        }
    }

    /// How many tool calls the answer made so far.
    pub(crate) fn calls(&self) -> usize {
        self.tools.as_ref().map_or(0, Parser::calls)
    }

    fn route(&mut self, out: &mut Vec<Delta>) {
        let pieces = std::mem::take(&mut self.pieces);
        for (reasoning, text) in pieces {
            if reasoning {
                push_text(out, Delta::Reasoning(text));
            } else {
                self.content(&text, out);
            }
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<Delta>) {
        match &mut self.tools {
            Some(tools) => tools.push(text, out),
            None => push_text(out, Delta::Text(text.to_string())),
        }
    }
}

/// Appends a text or reasoning delta, merged into the last one of its kind.
pub(crate) fn push_text(out: &mut Vec<Delta>, delta: Delta) {
    match (out.last_mut(), delta) {
        (_, Delta::Text(t) | Delta::Reasoning(t)) if t.is_empty() => {}
        (Some(Delta::Text(last)), Delta::Text(t)) => last.push_str(&t),
        (Some(Delta::Reasoning(last)), Delta::Reasoning(t)) => last.push_str(&t),
        (_, delta) => out.push(delta),
    }
}

/// The longest tail of `text` that is a proper prefix of one of `markers`,
/// in bytes: text a marker split across chunks may still complete.
pub(crate) fn partial_tail(text: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let from = text.len().saturating_sub(longest.saturating_sub(1));
    (from..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| markers.iter().any(|m| m.starts_with(&text[i..])))
        .map_or(0, |i| text.len() - i)
}
