//! The MTP proposer: MiMo's multi-token-prediction layer computes what
//! Hugging Face and vLLM define (checked against `tests/mtp_reference.py`),
//! proposes for the batcher's speculation, and leaves greedy ids exactly
//! plain decoding's, cold, from a cached prefix and with company; a model
//! without the layer decodes plainly and says why.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hangar_native_mlx::{
    BatchOptions, Batcher, Completion, GenerateRequest, Prompt, Session, Speculation,
};
use serde_json::{json, Value};

use crate::fixtures::{fixtures, python, python_reference, repo};

/// Folders of the MTP fixtures beside the shared ones: `mimo-q4-mtp`
/// (mlx-lm's 4-bit conversion, which dropped the layer, with the layer
/// quantized alike as `model-mtp.safetensors`) and `mimo-echo` (one
/// layer, and an MTP layer derived from it: see `make_tiny_model.py
/// --mtp-from-main`).
fn extra() -> &'static (tempfile::TempDir, PathBuf, PathBuf) {
    static EXTRA: OnceLock<(tempfile::TempDir, PathBuf, PathBuf)> = OnceLock::new();
    EXTRA.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let quantized = dir.path().join("mimo-q4-mtp");
        copy_dir(&fixtures().model("mimo-q4"), &quantized);
        python_reference(
            "mtp_reference.py",
            &json!({"quantize": [{"from": fixtures().model("mimo"), "to": quantized,
                "bits": 4, "group_size": 64}]}),
        );
        let echo = dir.path().join("mimo-echo");
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(&echo)
            .args(["--arch", "mimo", "--layers", "1", "--mtp-from-main"])
            .args(crate::fixtures::WIDTH)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_model.py mimo-echo failed");
        (dir, quantized, echo)
    })
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

/// A prompt of the tiny vocabulary, `len` tokens, not repetitive (so that
/// nothing but the MTP layer could guess).
fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + 11) % 500 + 3).collect()
}

fn request(prompt: Vec<u32>, speculation: Speculation, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt), max_tokens);
    r.ignore_eos = true;
    r.speculation = speculation;
    r
}

fn mtp(k: usize) -> Speculation {
    Speculation {
        mtp: true,
        k,
        ..Speculation::default()
    }
}

fn run(b: &Batcher, r: &GenerateRequest) -> Completion {
    b.generate(r.clone(), |_| ControlFlow::Continue(()))
        .unwrap()
}

fn batcher(model: &std::path::Path) -> Batcher {
    Batcher::start(Session::load(model).unwrap(), BatchOptions::default())
}

/// The layer's logits at every position and its recursive guesses are
/// the reference's, in float32 and 4-bit; and the reference tells them
/// from two wrong readings of the layer (the concatenation the other way
/// round, the hidden states after the final norm), so a layer built that
/// way would fail here.
#[test]
fn the_mtp_layer_computes_what_hugging_face_and_vllm_define() {
    let (_, quantized, _) = extra();
    let tokens = prompt(24);
    for (model, tolerance) in [(fixtures().model("mimo"), 1e-4), (quantized.clone(), 1e-3)] {
        let session = Session::load(&model).unwrap();
        assert_eq!(session.model().mtp_layers(), 1, "{}", model.display());
        let answer = python_reference(
            "mtp_reference.py",
            &json!({"cases": [{"model": model, "tokens": tokens, "k": 4}]}),
        );
        let case = &answer["cases"][0];
        let floats = |v: &Value| -> Vec<f32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        let expected = floats(&case["logits"]);
        let got = session.model().mtp_logits_of(&tokens).unwrap();
        assert_eq!(got.len(), expected.len());
        let distance = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max)
        };
        let off = distance(&got, &expected);
        eprintln!("{}: logits off by {off}", model.display());
        assert!(off < tolerance, "{}: logits off by {off}", model.display());
        for wrong in ["swapped", "post_norm"] {
            let apart = distance(&floats(&case["wrong"][wrong]), &expected);
            eprintln!("{}: the {wrong} layer is {apart} away", model.display());
            assert!(
                apart > 10.0 * tolerance,
                "{}: the {wrong} layer is only {apart} away",
                model.display()
            );
        }
        let guesses: Vec<u32> = serde_json::from_value(case["guesses"].clone()).unwrap();
        assert_eq!(
            session.model().mtp_guesses(&tokens, 4).unwrap(),
            guesses,
            "{}",
            model.display()
        );
    }
}

/// Greedy ids with the MTP layer proposing are plain decoding's, bit for
/// bit, for k of 1 to 4 and adaptive, cold and from a cached prefix (the
/// layer then starts after the prefix), in float32 and 4-bit; and the
/// proposals are counted.
#[test]
fn mtp_greedy_ids_are_plain_decodings() {
    let (_, quantized, _) = extra();
    // Longer than a prefix-cache block, so that a second run restores one.
    let long = prompt(300);
    for model in [fixtures().model("mimo"), quantized.clone()] {
        let plain = run(
            &batcher(&model),
            &request(long.clone(), Speculation::default(), 40),
        );
        assert_eq!(plain.speculation.verifications, 0);
        for k in [1, 2, 3, 4, 0] {
            // A fresh engine: the prompt is computed, not restored.
            let b = batcher(&model);
            let cold = run(&b, &request(long.clone(), mtp(k), 40));
            assert_eq!(cold.usage.cached_prompt_tokens, 0);
            assert_eq!(
                cold.token_ids,
                plain.token_ids,
                "{}, k = {k}, cold",
                model.display()
            );
            let usage = cold.speculation;
            assert!(usage.verifications > 0 && usage.proposed > 0, "{usage:?}");
            assert!(usage.accepted <= usage.proposed, "{usage:?}");
            if k > 0 {
                // k proposals each verification, but near max_tokens
                // (where k - 1, ..., 1 fit).
                assert!(usage.proposed <= k * usage.verifications, "{usage:?}");
                assert!(
                    usage.proposed + k * (k + 1) / 2 >= k * usage.verifications,
                    "{usage:?}"
                );
            }
            let warm = run(&b, &request(long.clone(), mtp(k), 40));
            assert!(warm.usage.cached_prompt_tokens > 0, "{:?}", warm.usage);
            assert_eq!(
                warm.token_ids,
                plain.token_ids,
                "{}, k = {k}, cached",
                model.display()
            );
            assert!(warm.speculation.proposed > 0, "{:?}", warm.speculation);
        }
        // max_tokens is kept exactly.
        let short = run(&batcher(&model), &request(long.clone(), mtp(4), 7));
        assert_eq!(short.token_ids, plain.token_ids[..7]);
    }
}

/// While company shares the steps the layer keeps reading the model's
/// hidden states (batched rows), and when the sequence is alone again it
/// proposes from where it is: the ids stay plain decoding's.
#[test]
fn the_mtp_layer_keeps_up_through_company() {
    let model = fixtures().model("mimo");
    let b = batcher(&model);
    let first = request(prompt(40), mtp(3), 60);
    let plain = run(&b, &request(prompt(40), Speculation::default(), 60));
    let other = request(vec![1, 2, 3, 4, 5], Speculation::default(), 20);
    let other_plain = run(&b, &other);
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| run(&b, &first));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = s.spawn(|| run(&b, &other));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert_eq!(first.token_ids, plain.token_ids);
    assert!(first.speculation.proposed > 0, "{:?}", first.speculation);
    assert_eq!(second.token_ids, other_plain.token_ids);
}

/// A layer derived from the model (`--mtp-from-main`) guesses as the model
/// decodes, short of what the first token changes: most proposals are
/// kept, and the ids are plain decoding's. The random layer of `mimo`
/// keeps far fewer, which is what the check above can tell.
#[test]
fn a_layer_that_predicts_as_the_model_has_its_proposals_kept() {
    let (_, _, echo) = extra();
    let b = batcher(echo);
    let plain = run(&b, &request(prompt(40), Speculation::default(), 60));
    let got = run(&b, &request(prompt(40), mtp(4), 60));
    assert_eq!(got.token_ids, plain.token_ids);
    let u = got.speculation;
    let rate = u.accepted as f64 / u.proposed as f64;
    eprintln!("mimo-echo, k = 4: {u:?}, acceptance {rate:.2}");
    assert!(rate > 0.8, "{u:?}");
    // About k + 1 tokens a pass: 60 tokens in well under 60 passes.
    assert!(u.verifications < 25, "{u:?}");
    let random = run(
        &batcher(&fixtures().model("mimo")),
        &request(prompt(40), mtp(4), 60),
    )
    .speculation;
    let random_rate = random.accepted as f64 / random.proposed as f64;
    eprintln!("mimo, k = 4: {random:?}, acceptance {random_rate:.2}");
    assert!(random_rate < rate, "{random:?} against {u:?}");
}

/// A model without MTP layers (mlx-lm's conversion of a MiMo folder,
/// which drops them; another family) asked for them decodes plainly,
/// proposes nothing, and says why.
#[test]
fn a_model_without_mtp_layers_decodes_plainly_and_says_why() {
    for (model, words) in [
        (
            "mimo-q4",
            "declares 1 (num_nextn_predict_layers) but its weights have none",
        ),
        ("qwen2", "its family (Qwen2) has none"),
    ] {
        let session = Session::load(&fixtures().model(model)).unwrap();
        assert_eq!(session.model().mtp_layers(), 0, "{model}");
        let why = session.model().why_no_mtp().expect("a reason");
        assert!(why.contains(words), "{model}: {why}");
        let b = Batcher::start(session, BatchOptions::default());
        let plain = run(&b, &request(prompt(40), Speculation::default(), 20));
        let asked = run(&b, &request(prompt(40), mtp(4), 20));
        assert_eq!(asked.token_ids, plain.token_ids, "{model}");
        assert_eq!(asked.speculation.verifications, 0, "{model}");
    }
    let with = Session::load(&fixtures().model("mimo")).unwrap();
    assert_eq!(with.model().why_no_mtp(), None);
}
