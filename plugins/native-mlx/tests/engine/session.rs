//! Session behaviour: chat prompts, stop conditions, cancellation and prompt-prefix reuse.

use std::ops::ControlFlow;

use hangar_native_mlx::{
    ChatMessage, ChatOptions, Completion, Error, FinishReason, GenerateRequest, LoadOptions,
    Prompt, SamplingParams, Session,
};
use serde_json::json;

use crate::fixtures::{edited_copy, fixtures, PROMPT};
use crate::greedy::assert_same_greedy;

fn llama() -> Session {
    Session::load(&fixtures().model("llama")).unwrap()
}

fn tokens(ids: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest::new(Prompt::Tokens(ids.to_vec()), max_tokens)
}

/// Generates, checking that the streamed pieces add up to the final text.
fn generate(session: &mut Session, request: &GenerateRequest) -> Completion {
    let mut streamed = String::new();
    let done = session
        .generate(request, |event| {
            streamed.push_str(event.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(streamed, done.text);
    done
}

#[test]
fn chat_prompt_is_rendered_and_encoded_without_extra_specials() {
    let mut session = llama();
    let prompt = Prompt::Chat {
        messages: vec![ChatMessage::new("user", "Hello there")],
        options: ChatOptions::default(),
    };
    let ids = session.prompt_tokens(&prompt).unwrap();
    let expected = session
        .tokenizer()
        .encode(
            "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap();
    assert_eq!(ids, expected);
    let done = generate(&mut session, &GenerateRequest::new(prompt, 8));
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert_eq!(done.usage.prompt_tokens, ids.len());
    assert_eq!(done.usage.completion_tokens, 8);
    assert_eq!(done.token_ids.len(), 8);
}

#[test]
fn an_eos_token_from_config_ends_the_generation() {
    let mut request = tokens(&PROMPT, 16);
    request.ignore_eos = true;
    let free = generate(&mut llama(), &request).token_ids;
    let eos = free[5];
    let first = free.iter().position(|id| *id == eos).unwrap();

    let dir = edited_copy("llama", "config.json", |config| {
        config["eos_token_id"] = json!([eos]);
    });
    let mut session = Session::load(dir.path()).unwrap();
    let done = generate(&mut session, &tokens(&PROMPT, 16));
    assert_eq!(done.finish_reason, FinishReason::Stop);
    assert_eq!(done.token_ids, free[..first]);
    assert_eq!(done.usage.completion_tokens, first);
}

#[test]
fn a_stop_string_cuts_the_text_before_it() {
    let mut session = llama();
    let free = generate(&mut session, &tokens(&PROMPT, 48)).text;
    // Two plain characters from the middle of the text make the stop string.
    let chars: Vec<char> = free.chars().collect();
    let at = (chars.len() / 2..chars.len() - 1)
        .find(|&i| chars[i..i + 2].iter().all(|c| c.is_ascii_alphanumeric()))
        .expect("random text with two alphanumerics in a row");
    let stop: String = chars[at..at + 2].iter().collect();

    let mut request = tokens(&PROMPT, 48);
    request.stop = vec![stop.clone()];
    let done = generate(&mut session, &request);
    assert_eq!(done.finish_reason, FinishReason::Stop);
    assert_eq!(done.text, free[..free.find(&stop).unwrap()]);
}

#[test]
fn breaking_from_the_callback_cancels() {
    let mut session = llama();
    let mut seen = 0;
    let done = session
        .generate(&tokens(&PROMPT, 32), |_| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    assert_eq!(done.token_ids.len(), 3);
}

#[test]
fn a_follow_up_reuses_the_common_prefix() {
    follow_up_reuses_the_common_prefix("llama");
}

#[test]
fn a_follow_up_reuses_the_common_prefix_gemma3() {
    // Reused positions past the sliding window (8): the window's order
    // follows where each prompt ended, as in a fresh session.
    follow_up_reuses_the_common_prefix("gemma3_text");
}

fn follow_up_reuses_the_common_prefix(model: &str) {
    let load = || Session::load(&fixtures().model(model)).unwrap();
    let mut session = load();
    let first = generate(&mut session, &tokens(&PROMPT, 16));
    assert_eq!(first.usage.cached_prompt_tokens, 0);

    // The conversation goes on: the old prompt, part of the answer, new text.
    let follow_up: Vec<u32> = PROMPT
        .iter()
        .chain(&first.token_ids[..8])
        .chain(&[5, 6, 7])
        .copied()
        .collect();
    let reused = generate(&mut session, &tokens(&follow_up, 16));
    assert_eq!(reused.usage.cached_prompt_tokens, PROMPT.len() + 8);
    let fresh = generate(&mut load(), &tokens(&follow_up, 16));
    let (got, expected) = (&reused.token_ids, &fresh.token_ids);
    assert_same_greedy(model, &follow_up, got, expected, "reused prefix");

    // The same prompt again recomputes only its last token.
    let again = generate(&mut session, &tokens(&follow_up, 16));
    assert_eq!(again.usage.cached_prompt_tokens, follow_up.len() - 1);
    let (got, expected) = (&again.token_ids, &fresh.token_ids);
    assert_same_greedy(model, &follow_up, got, expected, "same prompt again");

    // A different conversation starts over.
    let other = generate(&mut session, &tokens(&[9, 9, 9], 4));
    assert_eq!(other.usage.cached_prompt_tokens, 0);
}

#[test]
fn scoring_a_greedy_completion_finds_its_tokens_and_how_far_others_miss() {
    let mut session = llama();
    let mut request = tokens(&PROMPT, 12);
    request.ignore_eos = true;
    let greedy = generate(&mut session, &request).token_ids;
    // On the session that generated them (its cache reused) and a fresh one.
    let scores = session.score(&PROMPT, &greedy).unwrap();
    assert_eq!(llama().score(&PROMPT, &greedy).unwrap(), scores);
    for (s, &id) in scores.iter().zip(&greedy) {
        assert!(s.token == id && s.top == id && s.gap() == 0.0, "{s:?}");
        assert!(s.logprob < 0.0, "{s:?}");
    }
    // Another token in the fourth place misses by a positive gap, and the
    // tokens after it are scored after it.
    let mut other = greedy.clone();
    other[3] = (other[3] + 1) % 512;
    let changed = session.score(&PROMPT, &other).unwrap();
    assert_eq!(changed[..3], scores[..3]);
    assert!(
        changed[3].top == greedy[3] && changed[3].gap() > 0.0,
        "{:?}",
        changed[3]
    );
    assert_ne!(changed[4..], scores[4..]);

    let err = session.score(&PROMPT, &[u32::MAX]).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert!(session.score(&[], &[1]).is_err());
}

#[test]
fn scoring_a_seeded_completion_finds_each_draw() {
    let mut session = llama();
    let mut request = tokens(&PROMPT, 16);
    request.ignore_eos = true;
    request.sampling = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: Some(5),
        ..SamplingParams::greedy()
    };
    let sampled = generate(&mut session, &request).token_ids;
    let draws = llama()
        .score_draws(&PROMPT, &sampled, &request.sampling)
        .unwrap();
    for (d, &id) in draws.iter().zip(&sampled) {
        assert!(d.token == id && d.choice == id && d.miss == 0.0, "{d:?}");
    }
    // A token that the draw did not take misses by a positive share; what
    // the draw took stays its choice.
    let mut other = sampled.clone();
    other[5] = (0..512).find(|t| *t != sampled[5]).unwrap();
    let changed = session
        .score_draws(&PROMPT, &other, &request.sampling)
        .unwrap();
    assert_eq!(changed[..5], draws[..5]);
    assert!(
        changed[5].choice == sampled[5] && changed[5].miss > 0.0 && changed[5].miss <= 1.0,
        "{:?}",
        changed[5]
    );
    // Another seed draws elsewhere.
    let reseeded = SamplingParams {
        seed: Some(6),
        ..request.sampling.clone()
    };
    let elsewhere = session.score_draws(&PROMPT, &sampled, &reseeded).unwrap();
    assert!(elsewhere.iter().any(|d| d.miss > 0.0), "{elsewhere:?}");

    let err = session
        .score_draws(&PROMPT, &sampled, &SamplingParams::greedy())
        .unwrap_err();
    assert!(err.to_string().contains("needs a temperature"), "{err}");
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let mut session = llama();
    let err = session
        .generate(&tokens(&PROMPT, 0), |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid request: max_tokens must be at least 1"
    );

    let dir = edited_copy("llama", "tokenizer_config.json", |config| {
        config.as_object_mut().unwrap().remove("chat_template");
    });
    let mut session = Session::load(dir.path()).unwrap();
    let chat = Prompt::Chat {
        messages: vec![ChatMessage::new("user", "hi")],
        options: ChatOptions::default(),
    };
    let err = session
        .generate(
            &GenerateRequest::new(chat, 4),
            |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(matches!(err, Error::NoChatTemplate { .. }), "{err}");
}

#[test]
fn an_unknown_model_type_is_refused_at_load() {
    let dir = edited_copy("llama", "config.json", |config| {
        config["model_type"] = json!("gpt_neox");
    });
    let err = Session::load(dir.path()).err().unwrap();
    assert!(
        err.to_string().ends_with(
            "is not supported by native-mlx; supported model types: llama, mistral, qwen2, qwen3, \
             phi3, gemma3_text, gemma3, qwen3_moe, gpt_oss, mimo"
        ),
        "{err}"
    );
}

#[test]
fn a_session_can_move_to_a_worker_thread() {
    // With every product split, so the extra MLX streams move too.
    let options = LoadOptions {
        cpu_threads: 2,
        split_min_work: 0,
        ..LoadOptions::default()
    };
    let mut session = Session::load_with(&fixtures().model("llama"), &options).unwrap();
    let here = generate(&mut session, &tokens(&PROMPT, 8)).token_ids;
    // The cache (and the step still in flight) move along and are reused.
    let follow_up: Vec<u32> = PROMPT.iter().chain(&here).copied().collect();
    let request = tokens(&follow_up, 8);
    let there = std::thread::spawn(move || generate(&mut session, &request))
        .join()
        .unwrap();
    assert_eq!(there.usage.cached_prompt_tokens, PROMPT.len() + 7);
    let fresh = generate(&mut llama(), &tokens(&follow_up, 8));
    let (got, expected) = (&there.token_ids, &fresh.token_ids);
    assert_same_greedy("llama", &follow_up, got, expected, "on a worker thread");
}
