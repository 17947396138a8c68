//! Mixture-of-experts models beyond the shared parity cases: many tokens sorted by expert, as mlx-lm sorts them, and the dtypes MLX's CPU cannot route.

use std::ops::ControlFlow;
use std::process::{Command, Stdio};

use hangar_native_mlx::{probe, DeviceKind, GenerateRequest, Prompt, SamplingParams, Session};
use serde_json::json;

use crate::fixtures::{fixtures, python, reference, repo};
use crate::greedy::check_same_tokens;

/// A prompt whose prefill routes 99 tokens to 2 experts each: 198 pairs,
/// past the 64 from which mlx-lm's `SwitchGLU` sorts tokens by expert (the
/// parity cases' 12-token prompt stays below it).
fn long_prompt() -> Vec<u32> {
    (0..100).map(|i| (i * 37 + 11) % 509 + 3).collect()
}

#[test]
fn a_long_prompt_sorted_by_expert_gives_mlx_lm_ids() {
    // gpt-oss: the prompt is also 12 times its window.
    let models = ["qwen3_moe", "qwen3_moe-q4", "gpt_oss", "gpt_oss-q4"];
    let prompt = long_prompt();
    let cases: Vec<_> = models
        .iter()
        .map(|m| json!({"model": fixtures().model(m), "prompt": prompt, "max_tokens": 32}))
        .collect();
    let answer = reference(json!({"cases": cases}));
    let expected: Vec<Vec<u32>> = serde_json::from_value(answer["ids"].clone()).unwrap();
    let mut mismatches = Vec::new();
    for (model, expected) in models.iter().zip(&expected) {
        let mut session = Session::load(&fixtures().model(model)).unwrap();
        let request = GenerateRequest {
            ignore_eos: true,
            ..GenerateRequest::new(Prompt::Tokens(prompt.clone()), 32)
        };
        let got = session
            .generate(&request, |_| ControlFlow::Continue(()))
            .unwrap()
            .token_ids;
        let greedy = SamplingParams::greedy();
        let what = format!("{model}, a 100-token prompt");
        if let Err(e) = check_same_tokens(model, &prompt, &got, expected, &greedy, &what) {
            mismatches.push(e);
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn dense_bfloat16_experts_are_refused_on_the_cpu_and_run_on_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(python())
        .arg(repo().join("scripts/make_tiny_model.py"))
        .arg(dir.path())
        .args(["--arch", "qwen3_moe", "--dtype", "bfloat16"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "make_tiny_model.py failed");
    let loaded = Session::load(dir.path());
    if probe().expect("MLX answers").device == DeviceKind::Gpu {
        let mut session = loaded.unwrap();
        let request = GenerateRequest {
            ignore_eos: true,
            ..GenerateRequest::new(Prompt::Tokens(long_prompt()), 8)
        };
        let done = session.generate(&request, |_| ControlFlow::Continue(()));
        assert_eq!(done.unwrap().token_ids.len(), 8);
        return;
    }
    let err = loaded.err().expect("bfloat16 experts refused on the CPU");
    assert_eq!(
        err.to_string(),
        format!(
            "weights of {}: the experts 'model.layers.0.mlp.switch_mlp' are bfloat16, and MLX \
             multiplies experts on the CPU in float32 only; on the CPU use a float32 or a \
             quantized checkpoint (mlx_lm.convert -q)",
            dir.path().display()
        )
    );
}

#[test]
fn gpt_oss_as_openai_released_it_gives_mlx_lm_ids() {
    // MXFP4 blocks with gate and up rows interleaved and
    // `quantization_config` mxfp4, which mlx-lm reads through its sanitize.
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(python())
        .arg(repo().join("scripts/make_tiny_model.py"))
        .arg(dir.path())
        .args(["--arch", "gpt_oss"])
        .args(crate::fixtures::WIDTH)
        .arg("--openai-mxfp4")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "make_tiny_model.py failed");
    let prompt = long_prompt();
    let answer = reference(json!({"cases": [
        {"model": dir.path(), "prompt": prompt, "max_tokens": 32}]}));
    let expected: Vec<Vec<u32>> = serde_json::from_value(answer["ids"].clone()).unwrap();
    let mut session = Session::load(dir.path()).unwrap();
    let request = GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::new(Prompt::Tokens(prompt.clone()), 32)
    };
    let got = session
        .generate(&request, |_| ControlFlow::Continue(()))
        .unwrap()
        .token_ids;
    // The folder's absolute path serves as the fixture's name.
    let model = dir.path().to_str().unwrap();
    let greedy = SamplingParams::greedy();
    check_same_tokens(
        model,
        &prompt,
        &got,
        &expected[0],
        &greedy,
        "OpenAI's layout",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
