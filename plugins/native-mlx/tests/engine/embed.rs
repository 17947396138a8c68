//! Embeddings and rerank scores of random-weight BERT, XLM-RoBERTa and Qwen3 folders (`scripts/make_tiny_embedder.py`) against `tests/embed_reference.py` (numpy from transformers' definitions; mlx-lm for the decoder).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hangar_native_mlx::{model_kind, Answer, Embedder, LoadOptions, ModelKind, Pooling};
use serde_json::{json, Value};

use crate::fixtures::{python, repo};
use crate::greedy::on_gpu;

const TEXTS: [&str; 4] = [
    "Hello, world!",
    "Paris is the capital of France.",
    "A search engine ranks documents by how well they answer a query.",
    "blue",
];

/// The folder of fixture `kind`, made once per test run.
fn folder(kind: &str) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR
        .get_or_init(|| tempfile::tempdir().unwrap())
        .path()
        .join(kind);
    if !dir.join("model.safetensors").exists() {
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_embedder.py"))
            .args([kind, dir.to_str().unwrap(), "--seed", "3"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_embedder.py {kind} failed");
    }
    dir
}

fn reference(request: Value) -> Value {
    crate::fixtures::python_reference("embed_reference.py", &request)
}

fn load(kind: &str) -> Embedder {
    let dir = folder(kind);
    Embedder::load(&dir, model_kind(&dir).unwrap(), &LoadOptions::default()).unwrap()
}

fn done<T>(answer: Answer<T>) -> Vec<T> {
    match answer {
        Answer::Done { results, .. } => results,
        Answer::Refused { message, .. } => panic!("refused: {message}"),
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Vectors for `TEXTS` equal the reference's within 1e-4, and the batch
/// equals each input alone (padded or not) within 1e-5, twice identically.
fn check_embedder(kind: &str, pooling: Pooling) {
    let e = load(kind);
    assert_eq!(e.kind(), ModelKind::Embedder);
    assert_eq!(e.pooling(), pooling);
    assert!(e.normalized());
    let ids: Vec<Vec<u32>> = TEXTS.iter().map(|t| e.encode(t).unwrap()).collect();
    let want = reference(json!({"model": folder(kind), "texts": TEXTS, "inputs": ids}));
    let want_ids: Vec<Vec<u32>> = serde_json::from_value(want["ids"].clone()).unwrap();
    assert_eq!(
        ids, want_ids,
        "{kind}: token ids differ from the tokenizers library's"
    );
    let batch = done(e.embed(&ids).unwrap());
    for (i, (got, want)) in batch
        .iter()
        .zip(want["vectors"].as_array().unwrap())
        .enumerate()
    {
        let d = max_diff(got, &floats(want));
        assert!(
            d < 1e-4,
            "{kind}: input {i} differs from the reference by {d}"
        );
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{kind}: norm {norm}");
        let alone = done(e.embed(std::slice::from_ref(&ids[i])).unwrap()).remove(0);
        let d = max_diff(got, &alone);
        assert!(
            d < 1e-5,
            "{kind}: input {i} in a padded batch differs from alone by {d}"
        );
    }
    assert_eq!(
        done(e.embed(&ids).unwrap()),
        batch,
        "{kind}: not deterministic"
    );
}

#[test]
fn bert_cls_embeddings_match_the_reference() {
    check_embedder("bert", Pooling::Cls);
}

#[test]
fn xlm_roberta_mean_embeddings_match_the_reference() {
    check_embedder("xlmr", Pooling::Mean);
}

#[test]
fn qwen3_last_token_embeddings_match_mlx_lm() {
    check_embedder("qwen3", Pooling::Last);
}

#[test]
fn rerank_scores_match_the_reference() {
    let docs: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    let query = "What is the capital of France?";
    for kind in ["bert-rerank", "xlmr-rerank"] {
        let e = load(kind);
        assert_eq!(e.kind(), ModelKind::Reranker);
        let pairs: Vec<_> = docs.iter().map(|d| json!([query, d])).collect();
        let want = floats(&reference(json!({"model": folder(kind), "pairs": pairs}))["scores"]);
        let got = done(e.rerank(query, &docs).unwrap());
        let d = max_diff(&got, &want);
        assert!(
            d < 1e-4,
            "{kind}: scores {got:?} differ from {want:?} by {d}"
        );
        // Alone and in a padded batch: the same up to float rounding on the
        // CPU; on a GPU, whose float32 products round to TF32 and differ by
        // shape, within the reference's tolerance.
        let alone = done(e.rerank(query, &docs[2..3]).unwrap());
        let tolerance = if on_gpu() { 1e-4 } else { 1e-5 };
        let d = (alone[0] - got[2]).abs();
        assert!(d < tolerance, "{kind}: batch and alone differ by {d}");
        let err = e.embed(&[vec![0, 1]]).unwrap_err().to_string();
        assert!(err.contains("is a reranker"), "{err}");
    }
}

#[test]
fn inputs_the_model_cannot_read_are_refused_by_index() {
    let e = load("bert");
    assert_eq!(e.max_tokens(), 128); // sentence_bert_config.json, under 514 positions
    let ok = e.encode("hello").unwrap();
    let refused = |inputs: &[Vec<u32>]| match e.embed(inputs).unwrap() {
        Answer::Refused { input, message } => (input, message),
        Answer::Done { .. } => panic!("not refused"),
    };
    let (input, message) = refused(&[ok.clone(), ok.clone(), vec![5; 129]]);
    assert_eq!(input, 2);
    assert!(
        message.starts_with("input 2 has 129 tokens; model 'bert' reads at most 128"),
        "{message}"
    );
    assert_eq!(refused(&[vec![], ok.clone()]).0, 0);
    let (input, message) = refused(&[ok.clone(), vec![2, 100_000, 3]]);
    assert_eq!(input, 1);
    assert!(message.contains("token id 100000"), "{message}");
    assert!(matches!(
        e.embed(&[vec![5; 128]]).unwrap(),
        Answer::Done { .. }
    ));

    let r = load("xlmr-rerank");
    let long = "blue ".repeat(600);
    match r.rerank("q", &["short".into(), long]).unwrap() {
        Answer::Refused { input, message } => {
            assert_eq!(input, 1);
            assert!(message.starts_with("document 1 has"), "{message}");
        }
        Answer::Done { .. } => panic!("not refused"),
    }
}

#[test]
fn model_kinds_follow_the_host_rules() {
    for (kind, want) in [
        ("bert", ModelKind::Embedder),
        ("xlmr", ModelKind::Embedder),
        ("qwen3", ModelKind::Embedder),
        ("bert-rerank", ModelKind::Reranker),
        ("xlmr-rerank", ModelKind::Reranker),
    ] {
        assert_eq!(model_kind(&folder(kind)).unwrap(), want, "{kind}");
    }
    // qwen3 without modules.json is a chat model.
    let chat = folder("qwen3").with_file_name("qwen3-chat");
    std::fs::create_dir_all(&chat).unwrap();
    std::fs::copy(
        folder("qwen3").join("config.json"),
        chat.join("config.json"),
    )
    .unwrap();
    assert_eq!(model_kind(&chat).unwrap(), ModelKind::Chat);
}
