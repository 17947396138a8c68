//! The parsers, format by format, fed as an engine would feed them: in the
//! chunks given, and again one character at a time (every marker split
//! across chunks), which must come out the same.

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::*;

/// The request's tools in these tests.
fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
        json!({"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}),
    ]
}

/// Splits `chunks` with a parser of `format` (and reasoning as `traits`
/// of a template say, when given) and renders the deltas, adjacent text
/// merged, one per line.
fn check_with(template: Option<&str>, format: Format, chunks: &[&str], expect: Expect) {
    let traits = template.map(ChatTraits::of_template).unwrap_or_default();
    let run = |chunks: &[String]| {
        let mut splitter = Splitter::new(&traits, Some(Parser::new(format, &tools(), "t")));
        let mut out = Vec::new();
        for chunk in chunks {
            splitter.push(chunk, &mut out);
        }
        splitter.finish(&mut out);
        render(out)
    };
    let given: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
    let rendered = run(&given);
    let by_char: Vec<String> = chunks.concat().chars().map(String::from).collect();
    assert_eq!(
        rendered,
        run(&by_char),
        "fed one character at a time, the answer split differently"
    );
    expect.assert_eq(&rendered);
}

fn check(format: Format, chunks: &[&str], expect: Expect) {
    check_with(None, format, chunks, expect)
}

fn render(deltas: Vec<Delta>) -> String {
    let mut merged: Vec<Delta> = Vec::new();
    for delta in deltas {
        match (merged.last_mut(), delta) {
            (
                Some(Delta::Args { index: i, fragment }),
                Delta::Args {
                    index,
                    fragment: more,
                },
            ) if *i == index => fragment.push_str(&more),
            (_, delta) => push_text(&mut merged, delta),
        }
    }
    merged
        .iter()
        .map(|d| match d {
            Delta::Text(t) => format!("text {t:?}"),
            Delta::Reasoning(t) => format!("reasoning {t:?}"),
            Delta::Call { index, id, name } => format!("call {index} {id} {name}"),
            Delta::Args { index, fragment } => format!("args {index} {fragment}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn hermes_calls_between_text() {
    check(
        Format::Hermes,
        &[
            "Let me check.\n<tool",
            "_call>\n{\"name\": \"get_weather\", \"argu",
            "ments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_",
            "call>",
        ],
        expect![[r#"
            text "Let me check.\n"
            call 0 call_t_0 get_weather
            args 0 {"city": "Paris"}
            call 1 call_t_1 add
            args 1 {"a": 1, "b": 2}"#]],
    );
    // A model that stops without the closing marker still made its call.
    check(
        Format::Hermes,
        &["<tool_call>{\"name\": \"add\", \"arguments\": {}}"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {}"#]],
    );
    // Arguments written as a JSON string are the same call.
    check(
        Format::Hermes,
        &["<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {"a":1}"#]],
    );
}

#[test]
fn a_malformed_call_falls_back_to_text() {
    check(
        Format::Hermes,
        &["ok <tool_call>get_weather(city=\"Paris\")</tool_call> more"],
        expect![[r#"text "ok <tool_call>get_weather(city=\"Paris\")</tool_call> more""#]],
    );
    check(
        Format::Hermes,
        &["<tool_call>{\"arguments\": {}}</tool_call>"],
        expect![[r#"text "<tool_call>{\"arguments\": {}}</tool_call>""#]],
    );
    // A marker's prefix that never completes is text too.
    check(
        Format::Hermes,
        &["a <tool", "_ca"],
        expect![[r#"text "a <tool_ca""#]],
    );
}

#[test]
fn a_streamed_call_whose_arguments_break_off_keeps_what_was_passed_on() {
    // Its name and first arguments went out before the break showed.
    check(
        Format::Hermes,
        &["<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": </tool_call> more"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {"a": 
            text "more""#]],
    );
}

#[test]
fn llama3_json_calls_begin_the_answer() {
    check(
        Format::Llama3,
        &[
            " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}; ",
            "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
        ],
        expect![[r#"
            call 0 call_t_0 get_weather
            args 0 {"city": "Paris", "days": 2}
            call 1 call_t_1 add
            args 1 {"a": 1, "b": 2}"#]],
    );
    check(
        Format::Llama3,
        &["<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {"a": 1}"#]],
    );
    // JSON that names no tool is the answer, and so is JSON after text.
    check(
        Format::Llama3,
        &["{\"name\": \"Ada\", \"age\": 36}"],
        expect![[r#"text "{\"name\": \"Ada\", \"age\": 36}""#]],
    );
    check(
        Format::Llama3,
        &["Sure: {\"name\": \"add\", \"parameters\": {}}"],
        expect![[r#"text "Sure: {\"name\": \"add\", \"parameters\": {}}""#]],
    );
}

#[test]
fn mistral_calls_in_both_generations() {
    check(
        Format::Mistral,
        &["[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}, \"id\": \"abc123def\"}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"],
        expect![[r#"
            call 0 abc123def add
            args 0 {"a":1,"b":2}
            call 1 call_t_1 get_weather
            args 1 {"city":"Oslo"}"#]],
    );
    check(
        Format::Mistral,
        &["[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]get_weather[CALL_ID]x9[ARGS]{\"city\": \"{Rome}\"}"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {"a": 1}
            call 1 x9 get_weather
            args 1 {"city": "{Rome}"}"#]],
    );
}

#[test]
fn qwen_xml_calls_typed_by_the_schema() {
    check(
        Format::QwenXml,
        &[
            "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n",
            "New York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        ],
        expect![[r#"
            text "I'll look.\n"
            call 0 call_t_0 get_weather
            args 0 {"city":"New York","days":3}"#]],
    );
    // Without the wrapper, and a string parameter that looks like a number.
    check(
        Format::QwenXml,
        &["<function=get_weather><parameter=city>1984</parameter></function>"],
        expect![[r#"
            call 0 call_t_0 get_weather
            args 0 {"city":"1984"}"#]],
    );
    check(
        Format::QwenXml,
        &["<tool_call>\n<function=get_weather>\n<parameter=city>Paris"],
        expect![[r#"
            call 0 call_t_0 get_weather
            args 0 {"city":"Paris"}"#]],
    );
}

#[test]
fn gemma_function_call_markers() {
    check(
        Format::Gemma,
        &[
            "<start_function_call>call:get_weather{city:<escape>Paris, France<escape>,days:2}<end_",
            "function_call>done",
        ],
        expect![[r#"
            call 0 call_t_0 get_weather
            args 0 {"city":"Paris, France","days":2}
            text "done""#]],
    );
    check(
        Format::Gemma,
        &["<start_function_call>call:add{a:1.5,b:[1,<escape>x<escape>],c:{d:true}}<end_function_call>"],
        expect![[r#"
            call 0 call_t_0 add
            args 0 {"a":1.5,"b":[1,"x"],"c":{"d":true}}"#]],
    );
    check(
        Format::Gemma,
        &["<start_function_call>get_weather{}<end_function_call>"],
        expect![[r#"text "<start_function_call>get_weather{}<end_function_call>""#]],
    );
}

const QWEN3: &str = "{%- if tools %}<tools>{{ tools }}</tools> <tool_call>{%- endif %}{{ '<think>' }}{{ '</think>' }}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
const R1: &str = "{% if tools %}{{ tools }}{% endif %}<think></think>{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}";

#[test]
fn reasoning_is_split_off_before_tool_calls() {
    check_with(
        Some(QWEN3),
        Format::Hermes,
        &[
            "<think>\nThe user wants wea",
            "ther.\n</thi",
            "nk>\n\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>",
        ],
        expect![[r#"
            reasoning "The user wants weather.\n"
            call 0 call_t_0 get_weather
            args 0 {"city": "Paris"}"#]],
    );
    // The prompt opened the reasoning: the answer starts inside it.
    check_with(
        Some(R1),
        Format::Hermes,
        &["hmm, 2+2", "</think>\n\nIt is 4."],
        expect![[r#"
            reasoning "hmm, 2+2"
            text "It is 4.""#]],
    );
    check_with(
        Some(R1),
        Format::Hermes,
        &["<think>\nhmm</think>4"],
        expect![[r#"
            reasoning "hmm"
            text "4""#]],
    );
}

#[test]
fn templates_say_which_parser_applies() {
    let describe = |template: &str| {
        let t = ChatTraits::of_template(template);
        format!(
            "tools={} format={} thinks={} starts_thinking={}",
            t.takes_tools,
            t.format.map_or("-", Format::name),
            t.thinks,
            t.starts_thinking
        )
    };
    let cases = [
        ("chatml", "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"),
        ("qwen3", QWEN3),
        ("r1", R1),
        ("qwen3.5", "{% if tools %}<tool_call>\n<function=name>\n<parameter=p>{% endif %}"),
        ("llama3.1", "{%- if tools is not none %}Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}<|eot_id|>{{ '<|python_tag|>' }}{% endif %}"),
        ("mistral", "{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]"),
        ("gemma", "{% if tools %}<start_function_declaration>{% endif %}<start_function_call>"),
        ("mytools", "{{ mytools }}"),
    ];
    let rendered: Vec<String> = cases
        .iter()
        .map(|(name, template)| format!("{name}: {}", describe(template)))
        .collect();
    expect![[r#"
        chatml: tools=false format=- thinks=false starts_thinking=false
        qwen3: tools=true format=hermes thinks=true starts_thinking=false
        r1: tools=true format=- thinks=true starts_thinking=true
        qwen3.5: tools=true format=qwen3_xml thinks=false starts_thinking=false
        llama3.1: tools=true format=llama3_json thinks=false starts_thinking=false
        mistral: tools=true format=mistral thinks=false starts_thinking=false
        gemma: tools=true format=gemma thinks=false starts_thinking=false
        mytools: tools=false format=- thinks=false starts_thinking=false"#]]
    .assert_eq(&rendered.join("\n"));
}
