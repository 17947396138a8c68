//! The plugin's behaviour, one `check` per case, snapshots of exactly what
//! would reach the engine.

use std::path::Path;

use expect_test::{expect, Expect};
use hangar_sdk::wire::{LoadRequest, ProbeInput, ProbeReport, ProbeRun};
use serde_json::{json, Value};

use crate::{plan_launch, probe, CAPABILITIES, MANIFEST};

/// The capabilities the manifest turns on for `version` (None: unknown).
fn capabilities(version: Option<&str>) -> Vec<String> {
    let manifest: toml::Table = toml::from_str(MANIFEST).unwrap();
    let Some(version) = version.and_then(|v| semver::Version::parse(v).ok()) else {
        return vec![];
    };
    manifest["capabilities"]
        .as_table()
        .unwrap()
        .iter()
        .filter(|(_, req)| {
            semver::VersionReq::parse(req.as_str().unwrap())
                .unwrap()
                .matches(&version)
        })
        .map(|(id, _)| id.clone())
        .collect()
}

fn model_dir(root: &Path, name: &str, config: Value) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.display().to_string()
}

/// Plans a launch of the model in `root/target` (whose config.json is
/// `target`) for an engine of `version` with `settings`; renders argv,
/// notes and files with `root` as `$ROOT`.
fn check(version: Option<&str>, target: Value, settings: Value, expected: Expect) {
    let root = tempfile::tempdir().unwrap();
    let model_path = model_dir(root.path(), "target", target);
    model_dir(
        root.path(),
        "mtp-drafter",
        json!({"model_type": "gemma4_assistant", "vocab_size": 1000}),
    );
    model_dir(root.path(), "dflash-drafter", json!({"vocab_size": 1000}));
    model_dir(
        root.path(),
        "small-drafter",
        json!({"model_type": "qwen3_5", "vocab_size": 999}),
    );
    let root_text = root.path().display().to_string();
    let settings =
        serde_json::from_str(&settings.to_string().replace("$ROOT", &root_text)).unwrap();
    let request = LoadRequest {
        model_id: "m".into(),
        model_path,
        format: "mlx".into(),
        accelerator: "cuda13".into(),
        engine: ProbeReport {
            available: true,
            version: version.map(str::to_string),
            program: Some("/opt/bin/mlxcel-server".into()),
            ..ProbeReport::default()
        },
        capabilities: capabilities(version),
        settings,
        plugin_settings: Default::default(),
        host: "127.0.0.1".into(),
        port: 9000,
        work_dir: format!("{root_text}/work"),
    };
    let text = match plan_launch(&request) {
        Ok(plan) => {
            let mut text = format!("{} {}\n", plan.program, plan.args.join(" "));
            for note in &plan.notes {
                text.push_str(&format!("note: {note}\n"));
            }
            for (name, contents) in &plan.files {
                text.push_str(&format!("file {name}:\n{contents}"));
            }
            text
        }
        Err(e) => format!("error: {e}\n"),
    };
    expected.assert_eq(&text.replace(&root_text, "$ROOT"));
}

fn qwen35() -> Value {
    json!({"model_type": "qwen3_5", "vocab_size": 1000})
}

const MANY: &str = r#"{"context_length": 8192, "parallel": 2, "kv_cache_type": "int8",
  "decode_storage": "paged", "prompt_cache": true, "reasoning_budget": 0, "apc": true}"#;

#[test]
fn flags_follow_the_versions_capabilities() {
    let many: Value = serde_json::from_str(MANY).unwrap();
    check(
        Some("0.0.20"),
        qwen35(),
        many.clone(),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -c 8192 --parallel 2 --cache-type-k int8 --cache-type-v int8
        note: setting 'decode_storage' was not applied: mlxcel-server >=0.0.21 is needed for paged_attention; found 0.0.20
        note: setting 'prompt_cache' was not applied: mlxcel-server >=0.0.25 is needed for prompt_cache; found 0.0.20
        note: setting 'apc' was not applied: mlxcel-server >=0.0.26 is needed for apc; found 0.0.20
        note: setting 'reasoning_budget' was not applied: mlxcel-server >=0.0.25 is needed for reasoning_budget; found 0.0.20
    "#]],
    );
    check(
        Some("0.0.26"),
        qwen35(),
        many.clone(),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -c 8192 --parallel 2 --cache-type-k int8 --cache-type-v int8 --decode-storage-backend paged --prompt-cache-enabled --apc-enabled --reasoning-budget 0
    "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        many.clone(),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -c 8192 --parallel 2 --cache-type-k int8 --cache-type-v int8 --decode-storage-backend paged --prompt-cache-enabled --apc-enabled --reasoning-budget 0
    "#]],
    );
    check(
        None,
        qwen35(),
        many,
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -c 8192 --parallel 2
        note: setting 'kv_cache_type' was not applied: mlxcel-server >=0.0.14 is needed for kv_cache_quantization; found an unknown version
        note: setting 'decode_storage' was not applied: mlxcel-server >=0.0.21 is needed for paged_attention; found an unknown version
        note: setting 'prompt_cache' was not applied: mlxcel-server >=0.0.25 is needed for prompt_cache; found an unknown version
        note: setting 'apc' was not applied: mlxcel-server >=0.0.26 is needed for apc; found an unknown version
        note: setting 'reasoning_budget' was not applied: mlxcel-server >=0.0.25 is needed for reasoning_budget; found an unknown version
    "#]],
    );
}

#[test]
fn turbo4_needs_its_own_capability() {
    let turbo = json!({"kv_cache_type": "turbo4", "kv_bits": 4});
    check(
        Some("0.0.21"),
        qwen35(),
        turbo.clone(),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: kv_cache_type turbo4 was not applied: mlxcel-server >=0.0.26 is needed for kv_cache_turbo; found 0.0.21
        note: setting 'kv_bits' was not applied: mlxcel-server >=0.0.26 is needed for kv_cache_turbo; found 0.0.21
    "#]],
    );
    check(
        Some("0.0.26"),
        qwen35(),
        turbo,
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --cache-type-k turbo4 --cache-type-v turbo4 --kv-bits 4
    "#]],
    );
}

#[test]
fn drafters_are_detected_paired_or_fallen_back_from() {
    let gemma = json!({"model_type": "gemma4", "vocab_size": 1000});
    check(
        Some("0.4.2"),
        gemma.clone(),
        json!({"draft_model": "$ROOT/mtp-drafter"}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/mtp-drafter --draft-kind mtp --draft-block-size 4
        note: speculative decoding with an MTP drafter
    "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/dflash-drafter", "draft_block_size": 8}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/dflash-drafter --draft-kind dflash --draft-block-size 8
        note: speculative decoding with a DFlash drafter
    "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/mtp-drafter"}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: speculative decoding is off, decoding normally: an MTP drafter needs a Gemma 4 target, and the model is 'qwen3_5'
    "#]],
    );
    check(
        Some("0.4.2"),
        gemma.clone(),
        json!({"draft_model": "$ROOT/dflash-drafter"}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: speculative decoding is off, decoding normally: a DFlash drafter needs a Qwen 3.5 text or VLM target, and the model is 'gemma4'
    "#]],
    );
    check(
        Some("0.0.26"),
        gemma,
        json!({"draft_model": "$ROOT/mtp-drafter"}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: speculative decoding is off, decoding normally: the drafter is an MTP drafter: mlxcel-server >=0.0.27 is needed for speculative_mtp; found 0.0.26
    "#]],
    );
    check(
        Some("0.0.26"),
        qwen35(),
        json!({"draft_model": "$ROOT/small-drafter", "draft_kind": "classic", "draft_tokens": 5}),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: speculative decoding is off, decoding normally: the drafter's vocabulary (999 tokens) differs from the model's (1000)
    "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "Qwen/Qwen3.5-0.8B"}),
        expect![[r#"
        error: draft_model 'Qwen/Qwen3.5-0.8B' is not a local model folder with a config.json; hub names are not fetched: download the drafter and give its absolute path
    "#]],
    );
}

#[test]
fn pipelines_write_the_distributed_config_and_say_what_peers_run() {
    let pipeline = json!({"pipeline": {"node_id": "a", "host": "10.0.0.1", "port": 9100, "layers": "0-13",
        "peers": [{"id": "b", "host": "10.0.0.2", "port": 9100, "layers": "14-27"}]}});
    check(
        Some("0.4.2"),
        qwen35(),
        pipeline.clone(),
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --distributed-config $ROOT/work/distributed.toml --node-id a --pp-layers 0-13
        note: pipeline peer 'b' (10.0.0.2:9100): copy $ROOT/work/distributed.toml to it and run: mlxcel-server --model $ROOT/target --host 10.0.0.2 --port 9100 --distributed-config distributed.toml --node-id b --pp-layers 14-27
        file distributed.toml:
        # mlxcel distributed config, written by Hangar (schema unconfirmed: see plugins/mlxcel/README.md)
        model = "$ROOT/target"

        [[nodes]]
        id = "a"
        host = "10.0.0.1"
        port = 9100
        layers = "0-13"

        [[nodes]]
        id = "b"
        host = "10.0.0.2"
        port = 9100
        layers = "14-27"
    "#]],
    );
    check(
        Some("0.0.21"),
        qwen35(),
        pipeline,
        expect![[r#"
        /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
        note: setting 'pipeline' was not applied, the model is served on this machine alone: mlxcel-server >=0.0.22 is needed for distributed_pipeline; found 0.0.21
    "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"pipeline": {"node_id": "a", "host": "h", "port": 1, "peers": []}}),
        expect![[r#"
        error: setting 'pipeline' needs a non-empty 'peers' list: a pipeline spans at least two machines
    "#]],
    );
    check(
        Some("0.0.22"),
        qwen35(),
        json!({"pipeline": {"node_id": "a", "host": "h", "port": 1, "role": "decode",
        "peers": [{"id": "b", "host": "g", "port": 2}]}}),
        expect![[r#"
            error: pipeline role 'decode' needs split prefill/decode: mlxcel-server >=0.2.0 is needed for split_prefill_decode; found 0.0.22
        "#]],
    );
}

fn check_probe(run: Option<ProbeRun>, expected: Expect) {
    let report = probe(&ProbeInput {
        settings: Default::default(),
        run,
    });
    expected.assert_eq(&format!(
        "available={} version={:?} detail={:?}\n",
        report.available, report.version, report.detail
    ));
}

fn exited(code: i32, stdout: &str, stderr: &str) -> Option<ProbeRun> {
    Some(ProbeRun::Exited {
        program: "/opt/bin/mlxcel-server".into(),
        code: Some(code),
        stdout: stdout.into(),
        stderr: stderr.into(),
    })
}

#[test]
fn probes_read_the_version_or_say_why_it_is_unknown() {
    check_probe(
        exited(0, "mlxcel-server 0.4.2\n", ""),
        expect![[r#"
        available=true version=Some("0.4.2") detail=None
    "#]],
    );
    check_probe(
        exited(0, "mlxcel-server nightly-7f3a\n", ""),
        expect![[r#"
        available=true version=None detail=Some("version 'nightly-7f3a' is not semver; gated capabilities off")
    "#]],
    );
    check_probe(
        exited(1, "", "error: GPU not found\n"),
        expect![[r#"
        available=true version=None detail=Some("`/opt/bin/mlxcel-server --version` failed (exit code 1): error: GPU not found; the version is unknown, so every gated capability is off")
    "#]],
    );
    check_probe(
        Some(ProbeRun::TimedOut {
            program: "/opt/bin/mlxcel-server".into(),
            after_ms: 5000,
        }),
        expect![[r#"
            available=true version=None detail=Some("/opt/bin/mlxcel-server did not print its version within 5000 ms; version unknown, gated capabilities off")
        "#]],
    );
    check_probe(
        Some(ProbeRun::NotFound {
            searched: vec!["PATH".into()],
        }),
        expect![[r#"
        available=false version=None detail=Some("mlxcel-server is not installed (looked in PATH); download a release asset (macOS arm64, linux-aarch64-cuda13, linux-x86_64-cuda13) and put it on PATH or set [plugins.mlxcel] program")
    "#]],
    );
}

#[test]
fn describe_matches_the_manifest() {
    let manifest = hangar_sdk::api::Manifest::parse(MANIFEST).unwrap();
    let mut declared: Vec<&str> = manifest.capabilities.keys().map(String::as_str).collect();
    let mut described: Vec<&str> = CAPABILITIES.to_vec();
    declared.sort();
    described.sort();
    assert_eq!(declared, described);
    assert_eq!(manifest.version.to_string(), env!("CARGO_PKG_VERSION"));
    for s in &manifest.settings {
        assert!(
            crate::FLAGS.iter().any(|f| f.setting == s.name)
                || [
                    "draft_model",
                    "draft_kind",
                    "draft_tokens",
                    "draft_block_size",
                    "pipeline",
                    "start_timeout_ms"
                ]
                .contains(&s.name.as_str()),
            "setting '{}' is declared but never mapped",
            s.name
        );
    }
}
