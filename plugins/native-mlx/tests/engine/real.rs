//! A real model: SmolLM2-135M-Instruct as `scripts/real-model.sh` converts it, against mlx-lm on the same folder.
//!
//! The random-weight fixtures show that every path computes what mlx-lm
//! computes; these show that the conversion gives a model that works: the
//! same greedy ids as mlx-lm on chat prompts, and a log-likelihood of plain
//! English text that matches mlx-lm's and is far better than a
//! random-weight model's.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hangar_native_mlx::{ChatMessage, ChatOptions, GenerateRequest, Prompt, Session};
use serde_json::{json, Value};

use crate::fixtures::{fixtures, reference, repo};
use crate::greedy::assert_same_greedy;

/// Greedy tokens compared per chat prompt.
const TOKENS: usize = 40;

const QUESTIONS: [&str; 3] = [
    "Name three colors.",
    "Write a Python function sum_list that returns the sum of a list of numbers.",
    "Explain in two sentences why the sky is blue.",
];

/// Plain English for the log-likelihood comparison (more than 200 tokens;
/// the first 201 are scored).
const TEXT: &str = "The history of aviation began long before the first powered flight. \
For centuries people watched birds and dreamed of leaving the ground, and many of them built \
wings of wood, cloth and feathers. Most of these attempts ended badly, but each one taught \
something about lift, weight and balance. In the eighteenth century two brothers in France \
filled a large paper balloon with hot air and sent it above a crowd, and soon people were \
riding in baskets beneath such balloons. Gliders came next. Engineers in Germany and England \
studied the shape of wings, measured the forces on them, and flew hundreds of short glides \
from hills. Their notes were read by two bicycle makers in the United States, who built a \
wind tunnel, tested many wing shapes, and designed a light engine and propellers of their own. \
In December of 1903 their machine left the sand of a windy beach and flew for twelve seconds. \
Within a few years airplanes crossed rivers, then seas, and the modern age of flight had begun.";

/// Tokens of [`TEXT`] scored: the first is the prompt, the rest are scored.
const SCORED: usize = 201;

/// The converted model folder: under `HANGAR_REAL_MODELS` (set by
/// scripts/test.sh), else laid out by scripts/real-model.sh in target/.
fn real_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("HANGAR_REAL_MODELS") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let out = Command::new(repo().join("scripts/real-model.sh"))
                    .arg(repo().join("target/real-models"))
                    .stderr(Stdio::inherit())
                    .output()
                    .unwrap();
                assert!(out.status.success(), "scripts/real-model.sh failed");
                let text = String::from_utf8(out.stdout).unwrap();
                PathBuf::from(
                    text.lines()
                        .last()
                        .expect("real-model.sh prints the folder"),
                )
            }
        };
        dir.join("smollm2-135m-instruct")
    })
    .clone()
}

fn chat(question: &str) -> Prompt {
    Prompt::Chat {
        messages: vec![ChatMessage::new("user", question)],
        options: ChatOptions::default(),
    }
}

#[test]
fn greedy_ids_on_chat_prompts_are_mlx_lms() {
    let model = real_model();
    let mut session = Session::load(&model).unwrap();
    let prompts: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| session.prompt_tokens(&chat(q)).unwrap())
        .collect();
    let cases: Vec<Value> = prompts
        .iter()
        .map(|p| json!({"model": model, "prompt": p, "max_tokens": TOKENS}))
        .collect();
    let expected: Vec<Vec<u32>> =
        serde_json::from_value(reference(json!({"cases": cases}))["ids"].take()).unwrap();
    for ((question, prompt), expected) in QUESTIONS.iter().zip(&prompts).zip(&expected) {
        let mut request = GenerateRequest::new(Prompt::Tokens(prompt.clone()), TOKENS);
        request.ignore_eos = true;
        let done = session
            .generate(&request, |_| ControlFlow::Continue(()))
            .unwrap();
        let text = session.tokenizer().decode(expected).unwrap();
        eprintln!("{question:?} -> {text:?}");
        // An absolute path is the model itself (the checker's model names
        // are fixture names, joined to the fixtures' folder).
        assert_same_greedy(
            model.to_str().unwrap(),
            prompt,
            &done.token_ids,
            expected,
            question,
        );
    }
    // The conversion answers sensibly: the colours are named.
    let colours = session
        .tokenizer()
        .decode(&expected[0])
        .unwrap()
        .to_lowercase();
    let named = [
        "red", "blue", "green", "yellow", "orange", "purple", "black", "white",
    ]
    .iter()
    .filter(|c| colours.contains(*c))
    .count();
    assert!(named >= 2, "{colours:?} names {named} colours");
}

/// Mean log-likelihood per token of `ids[1..]` after `ids[0]`, by native-mlx.
fn mean_logprob(model: &std::path::Path, ids: &[u32]) -> f64 {
    let mut session = Session::load(model).unwrap();
    let scores = session.score(&ids[..1], &ids[1..]).unwrap();
    scores.iter().map(|s| f64::from(s.logprob)).sum::<f64>() / scores.len() as f64
}

#[test]
fn log_likelihood_of_english_text_matches_mlx_lm_and_beats_random_weights() {
    let model = real_model();
    let session = Session::load(&model).unwrap();
    let ids = session.tokenizer().encode(TEXT, false).unwrap();
    assert!(ids.len() >= SCORED, "the text has {} tokens", ids.len());
    let ids = &ids[..SCORED];
    let ours = mean_logprob(&model, ids);
    let job = json!({"scores": [{"model": model, "prompt": &ids[..1], "continuation": &ids[1..]}]});
    let theirs: Vec<Vec<f64>> = serde_json::from_value(reference(job)["scores"].take()).unwrap();
    let theirs = theirs[0].iter().sum::<f64>() / theirs[0].len() as f64;

    // The random-weight fixture on the same text, through its own tokenizer.
    let random = fixtures().model("llama");
    let random_ids = Session::load(&random)
        .unwrap()
        .tokenizer()
        .encode(TEXT, false)
        .unwrap();
    let random = mean_logprob(&random, &random_ids[..SCORED.min(random_ids.len())]);
    eprintln!(
        "mean log-likelihood per token: native-mlx {ours:.4} (perplexity {:.2}), mlx-lm {theirs:.4} \
         (perplexity {:.2}), random-weight fixture {random:.4} (perplexity {:.1})",
        (-ours).exp(),
        (-theirs).exp(),
        (-random).exp()
    );
    let relative = (ours - theirs).abs() / theirs.abs();
    assert!(
        relative < 0.01,
        "native-mlx {ours} and mlx-lm {theirs} differ by {:.2} %",
        relative * 100.0
    );
    // A working model predicts English far better than chance: uniform over
    // SmolLM2's 49 152 ids is -10.8 nats a token; random weights do about as
    // badly over their own 512-id vocabulary (-6.2).
    assert!(
        ours > -4.0 && ours > random + 2.0,
        "native-mlx's {ours} is not far better than random weights' {random}"
    );
}
