//! Speculative decoding keeps greedy output: prompt lookup, a predicted
//! output and a draft model give the ids plain decoding gives, alone and
//! when company comes.

use std::ops::ControlFlow;

use hangar_native_mlx::{
    BatchOptions, Batcher, DraftLoad, Drafter, GenerateRequest, Prompt, Session, Speculation,
};

use crate::fixtures::{edited_copy, fixtures};

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
    // The engine timed plain steps of one sequence (the requests before),
    // so it estimates what speculating saved.
    assert!(usage.time_saved.is_some_and(f64::is_finite), "{usage:?}");
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
fn a_sequence_with_nothing_to_propose_decodes_on_the_plain_path() {
    let b = batcher();
    // No token of the prompt repeats: lookup has nothing to propose until
    // the answer repeats itself.
    let mut lookup = request(
        Speculation {
            prompt_lookup: true,
            k: 4,
            ..Speculation::default()
        },
        40,
    );
    lookup.prompt = Prompt::Tokens((1..40).collect());
    let mut plain = lookup.clone();
    plain.speculation = Speculation::default();
    let (expected, _) = ids(&b, &plain);
    let (got, usage) = ids(&b, &lookup);
    assert_eq!(got, expected);
    // Every verifying pass had proposals to verify: the steps without any
    // were plain, pipelined ones.
    let stats = b.step_stats();
    assert_eq!(stats.spec_steps, usage.verifications as u64, "{usage:?}");
    assert!(stats.decode_steps > 40, "{stats:?}");
}

#[test]
fn a_mixture_of_experts_verifies_many_tokens_in_one_pass() {
    // Each verified token is routed to its own experts within one pass;
    // gpt-oss's sliding layers mask each verified token's own window.
    for model in ["qwen3_moe", "gpt_oss"] {
        verifies_many_tokens_in_one_pass(model);
    }
}

fn verifies_many_tokens_in_one_pass(model: &str) {
    let session = Session::load(&fixtures().model(model)).unwrap();
    let b = Batcher::start(session, BatchOptions::default());
    let (plain, _) = ids(&b, &request(Speculation::default(), 40));
    let predicted = Speculation {
        prediction: Some(plain.clone()),
        k: 4,
        ..Speculation::default()
    };
    let (got, usage) = ids(&b, &request(predicted, 40));
    assert_eq!(got, plain, "{model}");
    assert!(usage.accepted_prediction >= 30, "{model}: {usage:?}");
    let wrong = Speculation {
        prediction: Some(vec![3; 20]),
        k: 4,
        ..Speculation::default()
    };
    let (got, usage) = ids(&b, &request(wrong, 40));
    assert_eq!(got, plain, "{model}");
    assert!(usage.rejected_prediction > 0, "{model}: {usage:?}");
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

/// A batcher of the llama fixture with fixture `draft` as its draft model.
fn with_drafter(draft: &str) -> Batcher {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    let drafter = match Drafter::load(&fixtures().model(draft), &session).unwrap() {
        DraftLoad::Fits(drafter) => *drafter,
        DraftLoad::Unfit(why) => panic!("{draft} should fit the llama fixture: {why}"),
    };
    Batcher::start_with_drafter(session, BatchOptions::default(), Some(drafter))
}

fn drafted(k: usize) -> Speculation {
    Speculation {
        draft_model: true,
        k,
        ..Speculation::default()
    }
}

/// A draft model proposes, the target decides: the model as its own
/// drafter has every proposal kept, its 4-bit copy most, a random model
/// of the same tokenizer (another family) few, and the ids are plain
/// decoding's each time, at any k, up to max_tokens exactly.
#[test]
fn a_draft_model_keeps_greedy_ids() {
    for (draft, all_kept) in [("llama", true), ("llama-q4", false), ("qwen2", false)] {
        let b = with_drafter(draft);
        let (plain, none) = ids(&b, &request(Speculation::default(), 40));
        assert_eq!(none.verifications, 0);
        for k in [1, 4, 0] {
            let (got, usage) = ids(&b, &request(drafted(k), 40));
            assert_eq!(got, plain, "drafter {draft}, k = {k}");
            assert!(usage.proposed > 0, "{draft}: {usage:?}");
            if all_kept {
                assert_eq!(
                    usage.accepted, usage.proposed,
                    "{draft}, k = {k}: {usage:?}"
                );
            }
        }
        let (got, _) = ids(&b, &request(drafted(8), 7));
        assert_eq!(got, plain[..7], "drafter {draft}, max_tokens 7");
    }
    // The random drafter is a poor one: the check above can tell.
    let (_, usage) = ids(&with_drafter("qwen2"), &request(drafted(4), 40));
    assert!(usage.accepted < usage.proposed, "{usage:?}");
}

/// While company shares the steps, the drafter's cache falls behind; it
/// catches up when the sequence is alone again, and the ids stay plain.
#[test]
fn a_drafter_catches_up_after_company() {
    let b = with_drafter("llama-q4");
    let (plain, _) = ids(&b, &request(Speculation::default(), 60));
    let mut other = request(Speculation::default(), 20);
    other.prompt = Prompt::Tokens(vec![1, 2, 3, 4, 5]);
    let (other_plain, _) = ids(&b, &other);
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| ids(&b, &request(drafted(4), 60)));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = s.spawn(|| ids(&b, &other));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert_eq!(first.0, plain);
    assert!(first.1.proposed > 0, "{:?}", first.1);
    assert_eq!(second.0, other_plain);
}

/// A drafter of another tokenizer, or of a family this engine does not
/// load, is not used, and says why; a folder that is not a model is an
/// error; a request for a draft model where none fits decodes plainly.
#[test]
fn a_drafter_that_does_not_fit_is_refused_with_the_reason() {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    let swapped = edited_copy("qwen2", "tokenizer.json", |t| {
        let vocab = t["model"]["vocab"].as_object_mut().unwrap();
        let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
        vocab.insert("a".into(), b);
        vocab.insert("b".into(), a);
    });
    match Drafter::load(swapped.path(), &session).unwrap() {
        DraftLoad::Unfit(why) => assert!(why.contains("gives 2 of the model's"), "{why}"),
        DraftLoad::Fits(_) => panic!("a swapped vocabulary must not fit"),
    }
    let other_family = edited_copy("qwen2", "config.json", |c| {
        c["model_type"] = "gpt_neox".into();
    });
    match Drafter::load(other_family.path(), &session).unwrap() {
        DraftLoad::Unfit(why) => assert!(why.contains("gpt_neox"), "{why}"),
        DraftLoad::Fits(_) => panic!("an unsupported family must not fit"),
    }
    let empty = tempfile::tempdir().unwrap();
    let error = Drafter::load(empty.path(), &session)
        .err()
        .expect("no model there");
    assert!(error.to_string().contains("draft_model"), "{error}");

    let b = Batcher::start(session, BatchOptions::default());
    let (plain, _) = ids(&b, &request(Speculation::default(), 20));
    let (got, usage) = ids(&b, &request(drafted(4), 20));
    assert_eq!(got, plain);
    assert_eq!(usage.verifications, 0, "{usage:?}");
}

/// The model's own first layer as its drafter (self-speculation): the
/// ids are plain decoding's, and a layer count the model cannot spare is
/// refused with the range.
#[test]
fn the_models_own_first_layers_draft() {
    let session = Session::load(&fixtures().model("llama")).unwrap();
    for bad in [0, 2] {
        let error = Drafter::first_layers(&session, bad).err().expect("refused");
        assert!(error.to_string().contains("from 1 to 1"), "{error}");
    }
    let drafter = Drafter::first_layers(&session, 1).unwrap();
    let b = Batcher::start_with_drafter(session, BatchOptions::default(), Some(drafter));
    let (plain, _) = ids(&b, &request(Speculation::default(), 40));
    for k in [1, 4] {
        let (got, usage) = ids(&b, &request(drafted(k), 40));
        assert_eq!(got, plain, "k = {k}");
        assert!(usage.proposed > 0, "{usage:?}");
    }
}
