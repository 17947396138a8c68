//! Speculative decoding keeps greedy output: prompt lookup and a predicted
//! output give the ids plain decoding gives, alone and when company comes.

use std::ops::ControlFlow;

use hangar_native_mlx::{BatchOptions, Batcher, GenerateRequest, Prompt, Session, Speculation};

use crate::fixtures::fixtures;

/// A repetitive prompt of the tiny vocabulary, so that lookup proposes.
fn prompt() -> Vec<u32> {
    let phrase = [17, 42, 99, 7, 256, 300, 12, 5];
    phrase.iter().cycle().take(40).copied().collect()
}

fn request(speculation: Speculation, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt()), max_tokens);
    r.ignore_eos = true;
    r.speculation = speculation;
    r
}

fn batcher() -> Batcher {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    Batcher::start(session, BatchOptions::default())
}

fn ids(b: &Batcher, r: &GenerateRequest) -> (Vec<u32>, hangar_native_mlx::SpecUsage) {
    let done = b
        .generate(r.clone(), |_| ControlFlow::Continue(()))
        .unwrap();
    (done.token_ids, done.speculation)
}

#[test]
fn greedy_ids_are_plain_decodings() {
    let b = batcher();
    let (plain, none) = ids(&b, &request(Speculation::default(), 40));
    assert_eq!(none.verifications, 0);
    for k in [1, 4, 0] {
        let lookup = Speculation {
            prompt_lookup: true,
            k,
            ..Speculation::default()
        };
        let (got, usage) = ids(&b, &request(lookup, 40));
        assert_eq!(got, plain, "prompt lookup, k = {k}");
        assert!(usage.proposed > 0, "{usage:?}");
    }
    // The answer itself as the prediction: nearly every proposal is kept.
    let predicted = Speculation {
        prediction: Some(plain.clone()),
        k: 4,
        ..Speculation::default()
    };
    let (got, usage) = ids(&b, &request(predicted, 40));
    assert_eq!(got, plain);
    assert_eq!(usage.accepted, usage.proposed, "{usage:?}");
    assert!(usage.accepted_prediction >= 30, "{usage:?}");
    // A wrong prediction costs the answer nothing.
    let wrong = Speculation {
        prediction: Some(vec![3; 20]),
        k: 4,
        ..Speculation::default()
    };
    let (got, usage) = ids(&b, &request(wrong, 40));
    assert_eq!(got, plain);
    assert!(usage.rejected_prediction > 0, "{usage:?}");
    // max_tokens is kept exactly.
    let (got, _) = ids(
        &b,
        &request(
            Speculation {
                prompt_lookup: true,
                k: 8,
                ..Speculation::default()
            },
            7,
        ),
    );
    assert_eq!(got, plain[..7]);
}

#[test]
fn company_turns_speculation_off_midway_without_changing_ids() {
    let b = batcher();
    let lookup = Speculation {
        prompt_lookup: true,
        k: 4,
        ..Speculation::default()
    };
    let (plain, _) = ids(&b, &request(Speculation::default(), 60));
    let mut other = request(Speculation::default(), 20);
    other.prompt = Prompt::Tokens(vec![1, 2, 3, 4, 5]);
    let (other_plain, _) = ids(&b, &other);
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| ids(&b, &request(lookup, 60)));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = s.spawn(|| ids(&b, &other));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert_eq!(first.0, plain);
    assert_eq!(second.0, other_plain);
}
