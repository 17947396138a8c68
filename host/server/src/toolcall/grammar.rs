//! The grammar that makes a constrained answer what its request asks for:
//! JSON of a schema (`response_format`), or a tool call in the model's own
//! markup (`tool_choice` `required` or a named function).
//!
//! Written in llguidance's Lark syntax, JSON schemas inside as
//! `%json { … }`, and sent to in-process engines with the
//! `structured_output` capability, which enforce it as a token mask. The
//! host writes it because the markup is the host's knowledge: the same
//! [`Format`] that reads a call back out of the answer says how a call is
//! written, so an engine needs a grammar engine and nothing of any model's
//! conventions. Engines behind an endpoint with grammars of their own
//! (llama-server) get the request's fields instead.
//!
//! JSON is written as models are taught it, one line with `, ` and `: `
//! (llguidance's `x-guidance` options), so that an answer cannot run on in
//! whitespace; the schema decides the rest.

use serde_json::{json, Map, Value};

use super::Format;

/// What a request forces its answer to be: JSON of a schema, a call of
/// one of its tools, or either.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Forced {
    /// JSON of this schema (`{"type": "object"}` for `json_object`), when
    /// the answer may be text.
    pub json: Option<Value>,
    /// The OpenAI function tools the answer may call (with no `json`, it
    /// must call one).
    pub tools: Vec<Value>,
    /// Whether several calls may follow each other.
    pub parallel: bool,
}

/// The Lark grammar of `forced` for a model writing calls in `format`;
/// `Err` says why no grammar can be written (to be the client's 400).
pub(crate) fn lark(forced: &Forced, format: Option<Format>) -> Result<String, String> {
    let mut grammar = String::new();
    let mut answers = Vec::new();
    if let Some(schema) = &forced.json {
        answers.push(json_rule(schema)?);
    }
    if !forced.tools.is_empty() {
        answers.push("calls".to_string());
        grammar = call_grammar(&forced.tools, forced.parallel, format)?;
    }
    Ok(format!("start: {}\n{grammar}", answers.join(" | ")))
}

fn call_grammar(tools: &[Value], parallel: bool, format: Option<Format>) -> Result<String, String> {
    let Some(format) = format else {
        return Err("the model's tool-call markup is not known (its chat template names none the host reads), so a call cannot be forced; set the model's 'tool_parser' setting".into());
    };
    // One rule per tool: its name, then its arguments as its schema says.
    let mut calls = Vec::new();
    for tool in tools {
        let function = tool.get("function").unwrap_or(&Value::Null);
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        let parameters = match function.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            _ => json!({"type": "object"}),
        };
        let arguments = json_rule(&parameters)?;
        calls.push(match format {
            Format::Hermes => format!(
                "\"<tool_call>\\n{{\\\"name\\\": \" {} \", \\\"arguments\\\": \" {arguments} \"}}\\n</tool_call>\"",
                literal(&serde_json::to_string(name).unwrap_or_default()),
            ),
            Format::Llama3 => format!(
                "\"{{\\\"name\\\": \" {} \", \\\"parameters\\\": \" {arguments} \"}}\"",
                literal(&serde_json::to_string(name).unwrap_or_default()),
            ),
            Format::Mistral => format!(
                "\"{{\\\"name\\\": \" {} \", \\\"arguments\\\": \" {arguments} \"}}\"",
                literal(&serde_json::to_string(name).unwrap_or_default()),
            ),
            Format::QwenXml | Format::Gemma => {
                return Err(format!(
                    "the host writes no grammar for calls in the '{}' markup yet (it writes them for hermes, llama3_json and mistral), so a call cannot be forced for this model; send 'tool_choice': \"auto\"",
                    format.name()
                ))
            }
        });
    }
    let (open, separator, close) = match format {
        Format::Mistral => ("\"[TOOL_CALLS][\" ", "\", \"", " \"]\""),
        Format::Hermes => ("", "\"\\n\"", ""),
        _ => ("", "\"; \"", ""),
    };
    let repeat = match parallel {
        true => format!(" ({separator} call)*"),
        false => String::new(),
    };
    Ok(format!(
        "calls: {open}call{repeat}{close}\ncall: {}\n",
        calls.join("\n    | ")
    ))
}

/// `%json { schema }`, with the options that keep JSON on one line.
fn json_rule(schema: &Value) -> Result<String, String> {
    let Value::Object(schema) = schema else {
        return Err(format!("a JSON schema must be an object, not {schema}"));
    };
    let mut schema: Map<String, Value> = schema.clone();
    schema.entry("x-guidance").or_insert_with(
        || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
    );
    Ok(format!("%json {}", Value::Object(schema)))
}

/// A Lark string literal of `text` (Lark's literals escape as JSON's do).
fn literal(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn grammars_say_what_the_answer_is() {
        let check = |forced: Forced, format: Option<Format>, expect: expect_test::Expect| {
            expect.assert_eq(&match lark(&forced, format) {
                Ok(g) => g,
                Err(e) => format!("error: {e}"),
            })
        };
        check(
            Forced {
                json: Some(json!({"type": "object"})),
                ..Forced::default()
            },
            None,
            expect_test::expect![[r#"
                start: %json {"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}}
            "#]],
        );
        check(
            Forced {
                tools: vec![weather()],
                ..Forced::default()
            },
            Some(Format::Hermes),
            expect_test::expect![[r#"
                start: calls
                calls: call
                call: "<tool_call>\n{\"name\": " "\"get_weather\"" ", \"arguments\": " %json {"properties":{"city":{"type":"string"}},"required":["city"],"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}} "}\n</tool_call>"
            "#]],
        );
        check(
            Forced {
                tools: vec![
                    weather(),
                    json!({"type": "function", "function": {"name": "now"}}),
                ],
                parallel: true,
                json: None,
            },
            Some(Format::Mistral),
            expect_test::expect![[r#"
                start: calls
                calls: "[TOOL_CALLS][" call (", " call)* "]"
                call: "{\"name\": " "\"get_weather\"" ", \"arguments\": " %json {"properties":{"city":{"type":"string"}},"required":["city"],"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}} "}"
                    | "{\"name\": " "\"now\"" ", \"arguments\": " %json {"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}} "}"
            "#]],
        );
        check(
            Forced { tools: vec![weather()], parallel: true, json: None },
            Some(Format::QwenXml),
            expect_test::expect!["error: the host writes no grammar for calls in the 'qwen3_xml' markup yet (it writes them for hermes, llama3_json and mistral), so a call cannot be forced for this model; send 'tool_choice': \"auto\""],
        );
        check(
            Forced {
                json: Some(json!({"type": "object"})),
                tools: vec![weather()],
                parallel: false,
            },
            Some(Format::Llama3),
            expect_test::expect![[r#"
                start: %json {"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}} | calls
                calls: call
                call: "{\"name\": " "\"get_weather\"" ", \"parameters\": " %json {"properties":{"city":{"type":"string"}},"required":["city"],"type":"object","x-guidance":{"item_separator":", ","key_separator":": ","whitespace_flexible":false}} "}"
            "#]],
        );
        check(
            Forced { tools: vec![weather()], parallel: true, json: None },
            None,
            expect_test::expect!["error: the model's tool-call markup is not known (its chat template names none the host reads), so a call cannot be forced; set the model's 'tool_parser' setting"],
        );
    }
}
