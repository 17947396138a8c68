//! SpecPrefill: a long prompt prefilled in part, scored by the model's own
//! first layers. Each kept token sits at its own position and decoding goes
//! on from the prompt's end: the answer does not depend on company, a prompt
//! kept whole is plain prefill, and the scores are attention weights.

use std::ops::ControlFlow;

use hangar_native_mlx::{
    BatchOptions, Batcher, Completion, Drafter, GenerateRequest, LoadOptions, Model, ModelConfig,
    Prompt, Session, SpecPrefill,
};

use crate::fixtures::fixtures;

/// A long prompt of the tiny vocabulary (1000 tokens, no repeats nearby).
fn long_prompt(seed: u32) -> Vec<u32> {
    (0..1000u32)
        .map(|i| (i * 37 + seed * 11) % 500 + 3)
        .collect()
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt), max_tokens);
    r.ignore_eos = true;
    r
}

/// A batcher of the llama fixture; with `spec`, its first layer scores.
fn batcher(spec: Option<SpecPrefill>) -> Batcher {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    let drafter = Drafter::first_layers(&session, 1).unwrap();
    let options = BatchOptions {
        spec_prefill: spec,
        ..BatchOptions::default()
    };
    Batcher::start_with_drafter(session, options, Some(drafter))
}

fn on(keep: f32) -> Option<SpecPrefill> {
    Some(SpecPrefill {
        min_tokens: 256,
        keep,
        lookahead: 8,
    })
}

fn run(b: &Batcher, r: GenerateRequest) -> Completion {
    b.generate(r, |_| ControlFlow::Continue(())).unwrap()
}

#[test]
fn a_prompt_prefilled_in_part_answers_alike_alone_and_in_company() {
    let b = batcher(on(0.3));
    let alone = run(&b, request(long_prompt(0), 24));
    assert_eq!(alone.token_ids.len(), 24);
    // The client's prompt counts whole.
    assert_eq!(alone.usage.prompt_tokens, 1000);
    let plain = run(&batcher(None), request(long_prompt(0), 24));
    assert_ne!(alone.token_ids, plain.token_ids, "nothing was left out");
    // Among other requests (short ones decoding, long ones prefilled in
    // part) it computes the same shapes at the same positions. (A fresh
    // engine: with its head cached, the share kept counts the rest alone.)
    let b = std::sync::Arc::new(batcher(on(0.3)));
    let company: Vec<_> = (1..4)
        .map(|seed| {
            let b = b.clone();
            std::thread::spawn(move || {
                let prompt = if seed == 2 {
                    vec![5, 6, 7]
                } else {
                    long_prompt(seed)
                };
                run(&b, request(prompt, 40)).token_ids
            })
        })
        .collect();
    let together = run(&b, request(long_prompt(0), 24));
    for c in company {
        c.join().unwrap();
    }
    assert_eq!(together.token_ids, alone.token_ids);
}

#[test]
fn a_short_prompt_or_keeping_everything_is_plain_prefill() {
    let plain = batcher(None);
    let short = request(long_prompt(1)[..200].to_vec(), 16);
    assert_eq!(
        run(&batcher(on(0.3)), short.clone()).token_ids,
        run(&plain, short).token_ids
    );
    let long = request(long_prompt(1), 16);
    assert_eq!(
        run(&batcher(on(1.0)), long.clone()).token_ids,
        run(&plain, long).token_ids
    );
}

#[test]
fn the_prefix_cache_reuses_only_the_head_before_the_first_gap() {
    let b = batcher(on(0.3));
    let first = run(&b, request(long_prompt(3), 8));
    assert_eq!(first.usage.cached_prompt_tokens, 0);
    let again = run(&b, request(long_prompt(3), 8));
    // The head (the first 128-token block) is whole in both; the blocks
    // after the first gap were never cached.
    let cached = again.usage.cached_prompt_tokens;
    assert!(cached > 0 && cached % 128 == 0 && cached < 1000, "{cached}");
    assert_eq!(again.token_ids.len(), 8);
}

#[test]
fn scores_are_attention_weights_summed_over_layers_heads_and_queries() {
    let dir = fixtures().model("llama");
    let config = ModelConfig::load(&dir).unwrap();
    let (layers, heads) = (config.num_layers, config.num_heads as usize);
    let model = Model::load(&dir, config, &LoadOptions::default()).unwrap();
    let prompt = long_prompt(4)[..300].to_vec();
    // Scored in chunks of 100 or at once: the same weights.
    let scores = model.importance(&prompt, 8, 100).unwrap();
    let whole = model.importance(&prompt, 8, 1000).unwrap();
    assert_eq!(scores.len(), 300);
    for (a, b) in scores.iter().zip(&whole) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    // Every query's weights sum to one.
    let total: f32 = scores.iter().sum();
    let expected = (layers * heads * 8) as f32;
    assert!(
        (total - expected).abs() < 1e-2 * expected,
        "{total} vs {expected}"
    );
    assert!(scores.iter().all(|&s| s >= 0.0));
}
