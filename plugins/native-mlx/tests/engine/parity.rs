//! native-mlx must produce exactly mlx-lm's token ids on the same model, prompt and seed
//! (on a GPU: the same ids, or near ties where they part; see `greedy`).

use std::ops::ControlFlow;

use hangar_native_mlx::{
    probe, ChatMessage, ChatOptions, ChatTemplate, DeviceKind, GenerateRequest, LoadOptions,
    Prompt, SamplingParams, Session,
};
use serde_json::{json, Map, Value};

use crate::fixtures::{fixtures, reference, CASES, CHATS, MAX_TOKENS, PROMPT};
use crate::greedy::check_same_tokens;

/// The default placement; every matrix split over three CPU streams (uneven
/// row blocks); and the projections fused (the GPU's default). None may
/// change a single bit. On a GPU the split is ignored (one stream), so it
/// would run the default's graph again: it is left out there.
fn placements() -> Vec<(&'static str, LoadOptions)> {
    let split = LoadOptions {
        cpu_threads: 3,
        split_min_work: 0,
        ..LoadOptions::default()
    };
    let fused = LoadOptions {
        fuse_projections: Some(true),
        ..LoadOptions::default()
    };
    let gpu = probe().expect("MLX answers").device == DeviceKind::Gpu;
    [
        ("default", LoadOptions::default()),
        ("split", split),
        ("fused", fused),
    ]
    .into_iter()
    .filter(|(name, _)| !(gpu && *name == "split"))
    .collect()
}

#[test]
fn token_ids_match_mlx_lm() {
    let fixtures = fixtures();
    let mut mismatches = Vec::new();
    for ((case, expected), (placement, options)) in CASES
        .iter()
        .zip(&fixtures.reference)
        .flat_map(|c| placements().into_iter().map(move |p| (c, p)))
    {
        let mut session = Session::load_with(&fixtures.model(case.model), &options).unwrap();
        let request = GenerateRequest {
            sampling: SamplingParams {
                temperature: case.temp,
                top_p: case.top_p,
                top_k: case.top_k,
                min_p: case.min_p,
                seed: Some(case.seed),
            },
            ignore_eos: true,
            ..GenerateRequest::new(Prompt::Tokens(PROMPT.to_vec()), MAX_TOKENS)
        };
        let got = session
            .generate(&request, |_| ControlFlow::Continue(()))
            .unwrap()
            .token_ids;
        assert_eq!(expected.len(), MAX_TOKENS);
        // mlx-lm's ids are "expected"; on a GPU both are scored by a session.
        let what = format!("{} (temp {}, {placement})", case.model, case.temp);
        if let Err(e) = check_same_tokens(
            case.model,
            &PROMPT,
            &got,
            expected,
            &request.sampling,
            &what,
        ) {
            mismatches.push(e);
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// Gemma 3's sliding windows (8 positions) against mlx-lm's rotating cache
/// at prompt lengths below the window, at it, past it, and past it by far:
/// a decoding query sums its window in the ring buffer's order, which
/// depends on where the prompt ended.
#[test]
fn sliding_windows_match_mlx_lm_at_every_prompt_length() {
    let fixtures = fixtures();
    let models = ["gemma3_text", "gemma3_text-q4"];
    let lengths = [1, 2, 5, 8, 9, 10, 17, 200];
    let prompt = |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 37 + 11) % 500 + 3).collect() };
    let max_tokens = 24;
    let cases: Vec<(&str, Vec<u32>)> = models
        .iter()
        .flat_map(|m| lengths.iter().map(move |&n| (*m, prompt(n))))
        .collect();
    let request = json!({"cases": cases.iter().map(|(m, p)| json!({
        "model": fixtures.model(m), "prompt": p, "max_tokens": max_tokens})).collect::<Vec<_>>()});
    let expected: Vec<Vec<u32>> = serde_json::from_value(reference(request)["ids"].take()).unwrap();
    let mut mismatches = Vec::new();
    for ((model, ids), expected) in cases.iter().zip(&expected) {
        let mut session = Session::load(&fixtures.model(model)).unwrap();
        let request = GenerateRequest {
            ignore_eos: true,
            ..GenerateRequest::new(Prompt::Tokens(ids.clone()), max_tokens)
        };
        let got = session
            .generate(&request, |_| ControlFlow::Continue(()))
            .unwrap()
            .token_ids;
        let what = format!("{model}, a prompt of {}", ids.len());
        if let Err(e) = check_same_tokens(model, ids, &got, expected, &request.sampling, &what) {
            mismatches.push(e);
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let fixtures = fixtures();
    let special = json!({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"});
    for (case, expected) in CHATS.iter().zip(&fixtures.chats) {
        let template = ChatTemplate::new(
            case.template.to_owned(),
            special.as_object().unwrap().clone(),
        )
        .unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_str(case.messages).unwrap();
        let options = ChatOptions {
            add_generation_prompt: case.add_generation_prompt,
            tools: case.tools.map(|t| serde_json::from_str(t).unwrap()),
            extra: Map::new(),
        };
        let got = template.render(&messages, &options);
        match (expected, got) {
            (Value::String(expected), Ok(got)) => {
                assert_eq!(&got, expected, "{}", case.name)
            }
            (Value::Object(error), Err(got)) => {
                let message = error["error"].as_str().unwrap();
                assert!(got.to_string().contains(message), "{}: {got}", case.name);
            }
            (expected, got) => panic!(
                "{}: transformers {expected:?}, native-mlx {got:?}",
                case.name
            ),
        }
    }
}
