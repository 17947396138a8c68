//! Constrained decoding: under a grammar a random-weight model still writes only what the grammar allows, and its company in a batch decodes as without it.

use std::ops::ControlFlow;

use hangar_native_mlx::{
    BatchOptions, Batcher, Completion, Error, FinishReason, GenerateRequest, Prompt,
    SamplingParams, Session,
};
use serde_json::Value;

use crate::batch::{try_run as run, try_run_together as run_together};
use crate::fixtures::fixtures;
use crate::greedy::assert_same_greedy;

/// The JSON options the host writes (one line, `, ` and `: `).
const COMPACT: &str = r#""x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

fn trip_schema() -> String {
    format!(
        r#"{{"type": "object", "properties": {{"city": {{"enum": ["Paris", "Rome", "Oslo"]}}, "days": {{"type": "integer", "minimum": 1, "maximum": 9}}, "train": {{"type": "boolean"}}}}, "required": ["city", "days", "train"], "additionalProperties": false, {COMPACT}}}"#
    )
}

/// A forced Hermes call of `get_weather(city)`, as the host writes it.
fn call_grammar() -> String {
    format!(
        r#"start: "<tool_call>\n{{\"name\": " "\"get_weather\"" ", \"arguments\": " %json {{"type": "object", "properties": {{"city": {{"enum": ["Paris", "Rome"]}}}}, "required": ["city"], "additionalProperties": false, {COMPACT}}} "}}\n</tool_call>""#
    )
}

fn request(seed: u32, grammar: Option<String>) -> GenerateRequest {
    let ids: Vec<u32> = (0..20).map(|i| (seed * 37 + i * 11) % 500 + 3).collect();
    let mut r = GenerateRequest::new(Prompt::Tokens(ids), 80);
    r.grammar = grammar;
    r
}

fn batcher() -> Batcher {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    Batcher::start(session, BatchOptions::default())
}

/// The answer parses as a trip of the schema, and ended where the JSON did.
fn assert_trip(done: &Completion) {
    assert_eq!(done.finish_reason, FinishReason::Stop, "{:?}", done.text);
    let trip: Value = serde_json::from_str(&done.text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", done.text));
    let city = trip["city"].as_str().unwrap_or_default();
    let days = trip["days"].as_i64().unwrap_or_default();
    assert!(["Paris", "Rome", "Oslo"].contains(&city), "{trip}");
    assert!((1..=9).contains(&days), "{trip}");
    assert!(trip["train"].is_boolean(), "{trip}");
    assert_eq!(trip.as_object().map(|o| o.len()), Some(3), "{trip}");
}

#[test]
fn a_json_schema_is_followed_greedy_and_seeded_alone_and_batched() {
    let b = batcher();
    let greedy = request(1, Some(format!("start: %json {}", trip_schema())));
    let mut seeded = request(2, greedy.grammar.clone());
    seeded.sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::greedy()
    };
    let alone = [run(&b, &greedy).unwrap(), run(&b, &seeded).unwrap()];
    for done in &alone {
        assert_trip(done);
    }
    // Batched with each other and with unconstrained company: the same
    // answers, and the company's tokens as without them.
    let company: Vec<GenerateRequest> = (3..7).map(|s| request(s, None)).collect();
    let company_alone: Vec<Vec<u32>> = company
        .iter()
        .map(|r| run(&b, r).unwrap().token_ids)
        .collect();
    let mut all = vec![greedy, seeded];
    all.extend(company.iter().cloned());
    let together = run_together(&b, &all);
    assert!(b.peak_batch() >= 4, "only {} ran together", b.peak_batch());
    for (done, alone) in together.iter().zip(&alone) {
        let done = done.as_ref().unwrap();
        assert_trip(done);
        assert_eq!(
            done.token_ids, alone.token_ids,
            "a constrained answer changed batched"
        );
    }
    for (i, (done, expected)) in together[2..].iter().zip(&company_alone).enumerate() {
        let done = done.as_ref().unwrap();
        let Prompt::Tokens(prompt) = &company[i].prompt else {
            unreachable!()
        };
        let what = format!("unconstrained request {i} beside constrained ones");
        assert_same_greedy("llama", prompt, &done.token_ids, expected, &what);
    }
}

#[test]
fn a_forced_call_gives_arguments_of_its_schema() {
    let b = batcher();
    let done = run(&b, &request(4, Some(call_grammar()))).unwrap();
    assert_eq!(done.finish_reason, FinishReason::Stop, "{:?}", done.text);
    let body = done
        .text
        .strip_prefix("<tool_call>\n")
        .and_then(|t| t.strip_suffix("\n</tool_call>"))
        .unwrap_or_else(|| panic!("not a Hermes call: {:?}", done.text));
    let call: Value = serde_json::from_str(body).unwrap();
    assert_eq!(call["name"], "get_weather");
    assert!(["Paris", "Rome"].contains(&call["arguments"]["city"].as_str().unwrap_or_default()));
}

#[test]
fn a_grammar_that_does_not_compile_fails_its_request_alone() {
    let b = batcher();
    let broken = request(5, Some("start: %json {\"type\": ".into()));
    let mut fine = request(6, None);
    fine.ignore_eos = true;
    let results = run_together(&b, &[broken, fine.clone()]);
    match &results[0] {
        Err(Error::InvalidRequest(what)) => assert!(what.contains("grammar"), "{what}"),
        other => panic!("a broken grammar is the request's error, not {other:?}"),
    }
    assert_eq!(results[1].as_ref().unwrap().token_ids.len(), 80);
    // A lone session refuses a grammar rather than ignore it.
    let mut session = Session::load(&fixtures().model("llama")).unwrap();
    let refused = session.generate(&request(5, Some("start: \"x\"".into())), |_| {
        ControlFlow::Continue(())
    });
    assert!(
        matches!(refused, Err(Error::InvalidRequest(_))),
        "{refused:?}"
    );
}
