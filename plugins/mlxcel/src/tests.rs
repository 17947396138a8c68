//! Tests of the plugin's behaviour: what it reads from `--version`, and the
//! exact command line, notes and files it plans for each engine version,
//! set of settings and drafter. The host's gating is simulated: each
//! version gets the capabilities the manifest grants it.
//!
//! Update the snapshots with `UPDATE_EXPECT=1 cargo test -p hangar-plugin-mlxcel`.

use std::path::Path;

use expect_test::{expect, Expect};
use hangar_sdk::wire::{LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun};
use hangar_sdk::Plugin;
use serde_json::{json, Value};

use super::*;

const BIN: &str = "/opt/bin/mlxcel-server";

/// The capabilities the manifest turns on for `version` (None: unknown),
/// as the host computes them.
fn capabilities(version: Option<&str>) -> Vec<String> {
    let manifest = manifest().unwrap();
    let Some(version) = version.and_then(|v| semver::Version::parse(v).ok()) else {
        return vec![];
    };
    manifest
        .capabilities
        .iter()
        .filter(|(_, req)| req.matches(&version))
        .map(|(id, _)| id.clone())
        .collect()
}

fn model_dir(root: &Path, name: &str, config: Value) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.display().to_string()
}

/// Plans a launch of the model in `$ROOT/target` (whose config.json is
/// `target`) for an engine of `version` with `settings` (`$ROOT` expanded),
/// and compares argv, readiness, notes and files (or the error) with
/// `expected`. `$ROOT` also holds drafters: `mtp` (gemma4_assistant),
/// `unified-mtp` (gemma4_unified_assistant), `qwen-mtp` (qwen3_5_mtp),
/// `dflash` (no model_type), `llama-small` (model_type llama) and
/// `no-vocab` (no model_type, no vocab_size); all but the last two have
/// 1000 tokens.
fn check(version: Option<&str>, target: Value, settings: Value, expected: Expect) {
    check_request(version, target, settings, |_| {}, expected)
}

/// [`check`], with the request changed by `edit` before planning.
fn check_request(
    version: Option<&str>,
    target: Value,
    settings: Value,
    edit: impl FnOnce(&mut LoadRequest),
    expected: Expect,
) {
    let root = tempfile::tempdir().unwrap();
    let model_path = model_dir(root.path(), "target", target);
    for (name, config) in [
        (
            "mtp",
            json!({"model_type": "gemma4_assistant", "vocab_size": 1000}),
        ),
        (
            "unified-mtp",
            json!({"model_type": "gemma4_unified_assistant", "text_config": {"vocab_size": 1000}}),
        ),
        (
            "qwen-mtp",
            json!({"model_type": "qwen3_5_mtp", "vocab_size": 1000}),
        ),
        ("dflash", json!({"vocab_size": 1000, "block_size": 16})),
        (
            "llama-small",
            json!({"model_type": "llama", "vocab_size": 999}),
        ),
        ("no-vocab", json!({"block_size": 16})),
    ] {
        model_dir(root.path(), name, config);
    }
    let root_text = root.path().display().to_string();
    let settings =
        serde_json::from_str(&settings.to_string().replace("$ROOT", &root_text)).unwrap();
    let mut request = LoadRequest::new("m", model_path, "mlx")
        .with_accelerator("cuda13")
        .with_engine(ProbeReport::available(version.map(str::to_string)).with_program(BIN))
        .with_capabilities(capabilities(version))
        .with_settings(settings)
        .with_endpoint("127.0.0.1", 9000)
        .with_work_dir(format!("{root_text}/work"));
    edit(&mut request);
    let text = match plan_launch(&request) {
        Ok(plan) => render(&plan),
        Err(e) => format!("error: {e}\n"),
    };
    expected.assert_eq(
        &text
            .replace(&root_text, "$ROOT")
            .replace(env!("CARGO_MANIFEST_DIR"), "$CRATE"),
    );
}

fn render(plan: &LaunchPlan) -> String {
    let quote = |a: &String| {
        if a.contains([' ', '"', '{']) {
            format!("'{a}'")
        } else {
            a.clone()
        }
    };
    let argv: Vec<String> = std::iter::once(&plan.program)
        .chain(&plan.args)
        .map(quote)
        .collect();
    let r = &plan.readiness;
    let mut text = format!(
        "{}\nready: GET {} -> {}, failed {:?}, warmup {:?}, within {} ms; upstream model {:?}\n",
        argv.join(" "),
        r.health_path,
        r.ready_status,
        r.failed_statuses,
        r.warmup,
        plan.start_timeout_ms,
        plan.upstream_model,
    );
    assert!(plan.env.is_empty() && plan.cwd.is_none());
    for note in &plan.notes {
        text.push_str(&format!("note: {note}\n"));
    }
    for (name, contents) in &plan.files {
        text.push_str(&format!("file {name}:\n{contents}"));
    }
    text
}

fn qwen35() -> Value {
    json!({"model_type": "qwen3_5", "vocab_size": 1000, "num_hidden_layers": 28})
}

fn gemma4() -> Value {
    json!({"model_type": "gemma4", "text_config": {"vocab_size": 1000}})
}

/// One setting of each capability (and of none).
fn many() -> Value {
    json!({
        "context_length": 8192, "max_tokens": 256, "parallel": 2,
        "kv_cache_type": "int8", "tensor_parallel_size": 2, "decode_storage": "paged",
        "prompt_cache": true, "prompt_cache_capacity_bytes": 1073741824, "prompt_cache_ttl": 600,
        "reasoning_budget": 0, "apc": true, "apc_block_size": 32, "kv_cache_budget": "auto",
        "chat_template_kwargs": {"enable_thinking": false},
    })
}

#[test]
fn flags_follow_the_capabilities_of_each_version() {
    check(
        Some("0.0.20"),
        qwen35(),
        many(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -n 256 --tp-size 2 --chat-template-kwargs '{"enable_thinking":false}' -c 8192 --parallel 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_type' was not applied (--cache-type-k/--cache-type-v): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_quantization; found 0.0.20
            note: setting 'decode_storage' was not applied (--decode-storage-backend): plugin 'mlxcel' needs mlxcel-server >=0.0.21 for paged_attention; found 0.0.20
            note: setting 'prompt_cache' was not applied (--prompt-cache-enabled/--no-prompt-cache): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found 0.0.20
            note: setting 'prompt_cache_capacity_bytes' was not applied (--prompt-cache-capacity-bytes): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found 0.0.20
            note: setting 'prompt_cache_ttl' was not applied (--prompt-cache-ttl): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found 0.0.20
            note: setting 'apc' was not applied (--apc-enabled): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for apc; found 0.0.20
            note: setting 'apc_block_size' was not applied (--apc-block-size): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for apc; found 0.0.20
            note: setting 'reasoning_budget' was not applied (--reasoning-budget): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for reasoning_budget; found 0.0.20
            note: setting 'kv_cache_budget' was not applied (--kv-cache-budget): plugin 'mlxcel' needs mlxcel-server >=0.2.0 for kv_cache_budget; found 0.0.20
        "#]],
    );
    check(
        Some("0.0.26"),
        qwen35(),
        many(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -n 256 --cache-type-k int8 --cache-type-v int8 --decode-storage-backend paged --prompt-cache-enabled=true --prompt-cache-capacity-bytes 1073741824 --prompt-cache-ttl 600 --apc-enabled=true --apc-block-size 32 --reasoning-budget=0 --tp-size 2 --chat-template-kwargs '{"enable_thinking":false}' -c 8192 --parallel 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_budget' was not applied (--kv-cache-budget): plugin 'mlxcel' needs mlxcel-server >=0.2.0 for kv_cache_budget; found 0.0.26
        "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        many(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -n 256 --cache-type-k int8 --cache-type-v int8 --decode-storage-backend paged --prompt-cache-enabled=true --prompt-cache-capacity-bytes 1073741824 --prompt-cache-ttl 600 --apc-enabled=true --apc-block-size 32 --reasoning-budget=0 --tp-size 2 --kv-cache-budget auto --chat-template-kwargs '{"enable_thinking":false}' -c 16384 --parallel 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
    // An unknown version keeps only the flags every release has.
    check(
        None,
        qwen35(),
        many(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -n 256 --chat-template-kwargs '{"enable_thinking":false}' -c 16384 --parallel 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_type' was not applied (--cache-type-k/--cache-type-v): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_quantization; found an unknown version
            note: setting 'decode_storage' was not applied (--decode-storage-backend): plugin 'mlxcel' needs mlxcel-server >=0.0.21 for paged_attention; found an unknown version
            note: setting 'prompt_cache' was not applied (--prompt-cache-enabled/--no-prompt-cache): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found an unknown version
            note: setting 'prompt_cache_capacity_bytes' was not applied (--prompt-cache-capacity-bytes): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found an unknown version
            note: setting 'prompt_cache_ttl' was not applied (--prompt-cache-ttl): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for prompt_cache; found an unknown version
            note: setting 'apc' was not applied (--apc-enabled): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for apc; found an unknown version
            note: setting 'apc_block_size' was not applied (--apc-block-size): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for apc; found an unknown version
            note: setting 'reasoning_budget' was not applied (--reasoning-budget): plugin 'mlxcel' needs mlxcel-server >=0.0.25 for reasoning_budget; found an unknown version
            note: setting 'tensor_parallel_size' was not applied (--tp-size): plugin 'mlxcel' needs mlxcel-server >=0.0.20 for tensor_parallel; found an unknown version
            note: setting 'kv_cache_budget' was not applied (--kv-cache-budget): plugin 'mlxcel' needs mlxcel-server >=0.2.0 for kv_cache_budget; found an unknown version
        "#]],
    );
}

#[test]
fn a_plain_model_gets_only_the_endpoint() {
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"prompt_cache": false, "apc": false, "max_tokens": null}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --no-prompt-cache --apc-enabled=false
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
}

#[test]
fn turbo4_and_kv_bits_need_the_turbo_capability() {
    let turbo = json!({"kv_cache_type": "turbo4", "kv_bits": 8});
    check(
        Some("0.0.21"),
        qwen35(),
        turbo.clone(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_type' was not applied (--cache-type-k/--cache-type-v): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_quantization; found 0.0.21
            note: setting 'kv_bits' was not applied (--kv-bits/--kv-quant-scheme): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_turbo; found 0.0.21
        "#]],
    );
    check(
        Some("0.0.26"),
        qwen35(),
        turbo,
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --cache-type-k turbo4 --cache-type-v turbo4 --kv-bits 8
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
}

/// `--kv-bits` takes 8 (uniform) or 4 with `--kv-quant-scheme turboquant`
/// (mlxcel's BatchKvQuantConfig::validate); the cache types arrived in
/// 0.0.26 with TurboQuant.
#[test]
fn kv_bits_are_8_or_turboquant_4() {
    for (bits, expected) in [
        (
            8,
            expect![[r#"
                /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --kv-bits 8
                ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            "#]],
        ),
        (
            4,
            expect![[r#"
                /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --kv-bits 4 --kv-quant-scheme turboquant
                ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            "#]],
        ),
        (
            6,
            expect![[r#"
                error: model 'm': setting kv_bits = 6 is invalid: mlxcel-server takes 8 (uniform) or 4 (TurboQuant) KV bits and refuses any other count
            "#]],
        ),
        (
            2,
            expect![[r#"
                error: model 'm': setting 'kv_bits' must be between 4 and 8, not 2
            "#]],
        ),
    ] {
        check(
            Some("0.4.2"),
            qwen35(),
            json!({ "kv_bits": bits }),
            expected,
        );
    }
    check(
        Some("0.0.25"),
        qwen35(),
        json!({"kv_cache_type": "int8"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_type' was not applied (--cache-type-k/--cache-type-v): plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_quantization; found 0.0.25
        "#]],
    );
}

/// 0.7.0 builds take `--offline`, which also stops the fetches of media
/// URLs named in requests; older builds would refuse the flag.
#[test]
fn offline_is_passed_where_the_binary_has_it() {
    check(
        Some("0.7.0"),
        qwen35(),
        json!({}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --offline
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
}

/// mlxcel's remote pipeline refuses a drafter and tensor parallelism at
/// start-up; the plan refuses them first, naming the settings.
#[test]
fn a_remote_pipeline_refuses_drafters_and_tensor_parallelism() {
    let with = |extra: Value| {
        let mut settings = two_stages();
        for (k, v) in extra.as_object().unwrap() {
            settings[k] = v.clone();
        }
        settings
    };
    check(
        Some("0.4.2"),
        qwen35(),
        with(json!({"draft_model": "$ROOT/dflash"})),
        expect![[r#"
            error: model 'm': setting draft_model cannot be combined with setting pipeline: mlxcel-server's remote pipeline (2 stages) refuses speculative decoding at start-up; remove one of the two settings
        "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        with(json!({"tensor_parallel_size": 2})),
        expect![[r#"
            error: model 'm': setting tensor_parallel_size cannot be combined with setting pipeline: mlxcel-server's remote pipeline (2 stages) refuses tensor parallelism at start-up; remove one of the two settings
        "#]],
    );
    // A drafter that falls back to normal decoding never reaches the
    // engine, so it does not clash; one stage is no remote pipeline.
    check(
        Some("0.4.2"),
        qwen35(),
        with(json!({"draft_model": "$ROOT/mtp", "tensor_parallel_size": 1})),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --tp-size 1 --distributed-config $ROOT/work/distributed.toml --node-id coordinator
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/mtp' is an MTP drafter (its model_type is 'gemma4_assistant'), and an MTP drafter needs a Gemma 4 target (model_type gemma4*), and the model is 'qwen3_5'
            note: pipeline peer 'stage-0' (pipeline_stage): start it before this model loads, on the machine at 192.168.1.22 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id stage-0 --port 18081 --no-warmup
            note: pipeline peer 'stage-1' (pipeline_stage): start it before this model loads, on the machine at 192.168.1.24 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id stage-1 --no-warmup
            file distributed.toml:
            # mlxcel-server --distributed-config for model 'm', written by Hangar's mlxcel plugin.
            # Schema *unconfirmed*: taken from mlxcel's public source (src/distributed/config.rs),
            # not from a release's documentation; see plugins/mlxcel/README.md.

            [cluster]
            name = "hangar-m"
            pipeline_parallel_size = 2
            transport_backend = "tcp"

            [[nodes]]
            id = "coordinator"
            address = "192.168.1.22:19000"
            role = "hybrid"

            [[nodes]]
            id = "stage-0"
            address = "192.168.1.22:19001"
            role = "pipeline_stage"
            stage = 0

            [[nodes]]
            id = "stage-1"
            address = "192.168.1.24:19001"
            role = "pipeline_stage"
            stage = 1
        "#]],
    );
}

#[test]
fn invalid_values_are_refused_with_the_model_and_the_reason() {
    let refused =
        |settings: Value, expected: Expect| check(Some("0.4.2"), qwen35(), settings, expected);
    refused(
        json!({"tensor_parallel_size": 3}),
        expect![[r#"
            error: model 'm': setting tensor_parallel_size = 3 is invalid: mlxcel shards across a power of 2 of ranks (1, 2, 4, 8, …)
        "#]],
    );
    refused(
        json!({"kv_cache_budget": "8GB"}),
        expect![[r#"
            error: model 'm': setting kv_cache_budget = "8GB" is invalid: it must be "auto", "none" or a whole number of bytes such as "8589934592"
        "#]],
    );
    refused(
        json!({"kv_cache_type": "q8_0"}),
        expect![[r#"
            error: model 'm': setting 'kv_cache_type' must be one of fp16, int8, turbo4, not 'q8_0'
        "#]],
    );
    refused(
        json!({"context_length": 0}),
        expect![[r#"
            error: model 'm': setting 'context_length' must be at least 1, not 0
        "#]],
    );
    refused(
        json!({"parallel": "four"}),
        expect![[r#"
            error: model 'm': setting 'parallel' must be a whole number, not "four"
        "#]],
    );
    refused(
        json!({"reasoning_budget": -2}),
        expect![[r#"
            error: model 'm': setting 'reasoning_budget' must be at least -1, not -2
        "#]],
    );
    refused(
        json!({"chat_template_kwargs": "enable_thinking=false"}),
        expect![[r#"
            error: model 'm': setting 'chat_template_kwargs' must be an object, not "enable_thinking=false"
        "#]],
    );
    refused(
        json!({"start_timeout_ms": "soon"}),
        expect![[r#"
            error: model 'm': setting start_timeout_ms = "soon" is invalid: it must be a whole number of milliseconds above 0
        "#]],
    );
    // The flag is never passed, so an invalid value of a capability that is
    // off cannot hurt the load: it is only noted.
    check(
        Some("0.0.20"),
        qwen35(),
        json!({"kv_cache_budget": "8GB"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'kv_cache_budget' was not applied (--kv-cache-budget): plugin 'mlxcel' needs mlxcel-server >=0.2.0 for kv_cache_budget; found 0.0.20
        "#]],
    );
}

#[test]
fn the_request_shapes_program_timeout_and_refusals() {
    // No resolved program: the manifest's name; the operator's plugin-wide
    // start timeout; a per-model one wins over it.
    check_request(
        Some("0.4.2"),
        qwen35(),
        json!({}),
        |r| {
            r.engine.program = None;
            r.plugin_settings
                .insert(START_TIMEOUT_MS.into(), json!(600000));
        },
        expect![[r#"
            mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 600000 ms; upstream model Some("m")
        "#]],
    );
    check_request(
        Some("0.4.2"),
        qwen35(),
        json!({"start_timeout_ms": 5000}),
        |r| {
            r.plugin_settings
                .insert(START_TIMEOUT_MS.into(), json!(600000));
        },
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 5000 ms; upstream model Some("m")
        "#]],
    );
    // mlxcel-server would download a -m that is no folder; it never gets one.
    check_request(
        Some("0.4.2"),
        qwen35(),
        json!({}),
        |r| r.model_path = "mlx-community/Qwen3-4B-4bit".into(),
        expect![[r#"
            error: model 'm': $CRATE/mlx-community/Qwen3-4B-4bit is not a model folder with a config.json; mlxcel-server serves MLX model folders (config.json, tokenizer, *.safetensors)
        "#]],
    );
    check_request(
        Some("0.4.2"),
        qwen35(),
        json!({}),
        |r| r.format = "gguf".into(),
        expect![[r#"
            error: model 'm': plugin 'mlxcel' serves the mlx format, not 'gguf'
        "#]],
    );
}

#[test]
fn drafters_are_detected_by_mlxcels_rule() {
    check(
        Some("0.4.2"),
        gemma4(),
        json!({"draft_model": "$ROOT/mtp"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/mtp
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding with an MTP drafter (its model_type is 'gemma4_assistant')
        "#]],
    );
    // The vocabulary may sit in text_config, on either side.
    check(
        Some("0.4.2"),
        gemma4(),
        json!({"draft_model": "$ROOT/unified-mtp", "draft_block_size": 2, "draft_tokens": 8}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/unified-mtp --draft-block-size 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'draft_tokens' was not applied: it sets a plain draft model's --draft-max; an MTP drafter drafts draft_block_size tokens
            note: speculative decoding with an MTP drafter (its model_type is 'gemma4_unified_assistant')
        "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/dflash"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/dflash
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding with a DFlash drafter (its config.json has no model_type, which mlxcel reads as DFlash)
        "#]],
    );
    // Builds before 0.0.27 have no drafter kinds: any drafter is a plain
    // draft model there, vocabulary unchecked.
    check(
        Some("0.0.20"),
        qwen35(),
        json!({"draft_model": "$ROOT/llama-small", "draft_tokens": 5, "draft_block_size": 4}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/llama-small --draft-max 5
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'draft_block_size' was not applied: it sizes MTP and DFlash drafter blocks, and this build runs draft_model as a plain draft model
            note: speculative decoding with a plain draft model (its model_type 'llama' is not an MTP type, which mlxcel reads as DFlash; builds before 0.0.27 run it as a plain draft model)
        "#]],
    );
    // An explicit kind is passed on; a block size only when it is set.
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/dflash", "draft_kind": "dflash", "draft_block_size": 8}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/dflash --draft-kind dflash --draft-block-size 8
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding with a DFlash drafter (draft_kind = "dflash")
        "#]],
    );
    // Without vocab_size on one side, the pairing holds with a note.
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/no-vocab", "draft_kind": "dflash"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --model-draft $ROOT/no-vocab --draft-kind dflash
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: the vocabularies of draft_model '$ROOT/no-vocab' and the model were not compared: a config.json has no vocab_size
            note: speculative decoding with a DFlash drafter (draft_kind = "dflash")
        "#]],
    );
}

#[test]
fn drafters_that_do_not_fit_fall_back_to_normal_decoding_and_say_why() {
    let fallback = |version: &str, target: Value, settings: Value, expected: Expect| {
        check(Some(version), target, settings, expected)
    };
    fallback(
        "0.4.2",
        qwen35(),
        json!({"draft_model": "$ROOT/mtp"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/mtp' is an MTP drafter (its model_type is 'gemma4_assistant'), and an MTP drafter needs a Gemma 4 target (model_type gemma4*), and the model is 'qwen3_5'
        "#]],
    );
    // qwen3_5_mtp is MTP by mlxcel's rule, and MTP pairs only with Gemma 4.
    fallback(
        "0.4.2",
        qwen35(),
        json!({"draft_model": "$ROOT/qwen-mtp"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/qwen-mtp' is an MTP drafter (its model_type is 'qwen3_5_mtp'), and an MTP drafter needs a Gemma 4 target (model_type gemma4*), and the model is 'qwen3_5'
        "#]],
    );
    // A plain small model is DFlash by mlxcel's rule: say how to use it.
    fallback(
        "0.4.2",
        json!({"model_type": "llama", "vocab_size": 999}),
        json!({"draft_model": "$ROOT/llama-small", "draft_tokens": 4}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/llama-small' is a DFlash drafter (its model_type 'llama' is not an MTP type, which mlxcel reads as DFlash), and a DFlash drafter needs a Qwen 3.5 text or VLM target (model_type qwen3_5*), and the model is 'llama'
        "#]],
    );
    fallback(
        "0.4.2",
        json!({"model_type": "qwen3_5_moe", "vocab_size": 2000}),
        json!({"draft_model": "$ROOT/dflash"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/dflash' is a DFlash drafter (its config.json has no model_type, which mlxcel reads as DFlash), and the drafter's vocabulary (1000 tokens) differs from the model's (2000)
        "#]],
    );
    // 0.0.26 drafts with plain draft models only: neither MTP nor DFlash.
    fallback(
        "0.0.26",
        gemma4(),
        json!({"draft_model": "$ROOT/mtp"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: draft_model '$ROOT/mtp' is an MTP drafter (its model_type is 'gemma4_assistant'), and plugin 'mlxcel' needs mlxcel-server >=0.0.27 for speculative_mtp; found 0.0.26
        "#]],
    );
    // An unknown version has no speculative decoding at all.
    check(
        None,
        gemma4(),
        json!({"draft_model": "$ROOT/mtp"}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: speculative decoding is off, decoding normally: plugin 'mlxcel' needs mlxcel-server >=0.0.1 for speculative; found an unknown version
        "#]],
    );
    check(
        Some("0.4.2"),
        gemma4(),
        json!({"draft_kind": "mtp", "draft_tokens": 4}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'draft_kind' was not applied: it does nothing without draft_model
            note: setting 'draft_tokens' was not applied: it does nothing without draft_model
        "#]],
    );
}

#[test]
fn a_drafter_must_be_a_local_folder() {
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "Qwen/Qwen3.5-0.8B-DFlash"}),
        expect![[r#"
            error: model 'm': setting draft_model = "Qwen/Qwen3.5-0.8B-DFlash" is invalid: '$CRATE/Qwen/Qwen3.5-0.8B-DFlash' is not a local model folder with a config.json; hub names are not fetched: download the drafter and give its folder
        "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/dflash", "draft_kind": "eagle"}),
        expect![[r#"
            error: model 'm': setting draft_kind = "eagle" is invalid: it must be auto, mtp or dflash (mlxcel has no classic drafter kind: it loads a plain small model as DFlash)
        "#]],
    );
    // mlxcel has no classic kind: a value stored before this was fixed is
    // refused, not mapped to something mlxcel would do differently.
    check(
        Some("0.4.2"),
        qwen35(),
        json!({"draft_model": "$ROOT/llama-small", "draft_kind": "classic"}),
        expect![[r#"
            error: model 'm': setting draft_kind = "classic" is invalid: it must be auto, mtp or dflash (mlxcel has no classic drafter kind: it loads a plain small model as DFlash)
        "#]],
    );
    check(
        Some("0.4.2"),
        gemma4(),
        json!({"draft_model": "$ROOT/mtp", "draft_block_size": 0}),
        expect![[r#"
            error: model 'm': setting draft_block_size = 0 is invalid: it must be a whole number above 0
        "#]],
    );
}

/// A two-stage pipeline as mlxcel's own example lays it out: this node
/// coordinates, stage 0 shares its machine, stage 1 is another machine.
fn two_stages() -> Value {
    json!({"pipeline": {
    "node_id": "coordinator", "host": "192.168.1.22", "port": 19000,
    "peers": [
        {"id": "stage-0", "host": "192.168.1.22", "port": 19001, "http_port": 18081},
        {"id": "stage-1", "host": "192.168.1.24", "port": 19001},
    ]}})
}

#[test]
fn pipelines_write_the_cluster_file_and_say_what_each_peer_runs() {
    check(
        Some("0.4.2"),
        qwen35(),
        two_stages(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --distributed-config $ROOT/work/distributed.toml --node-id coordinator
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: pipeline peer 'stage-0' (pipeline_stage): start it before this model loads, on the machine at 192.168.1.22 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id stage-0 --port 18081 --no-warmup
            note: pipeline peer 'stage-1' (pipeline_stage): start it before this model loads, on the machine at 192.168.1.24 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id stage-1 --no-warmup
            file distributed.toml:
            # mlxcel-server --distributed-config for model 'm', written by Hangar's mlxcel plugin.
            # Schema *unconfirmed*: taken from mlxcel's public source (src/distributed/config.rs),
            # not from a release's documentation; see plugins/mlxcel/README.md.

            [cluster]
            name = "hangar-m"
            pipeline_parallel_size = 2
            transport_backend = "tcp"

            [[nodes]]
            id = "coordinator"
            address = "192.168.1.22:19000"
            role = "hybrid"

            [[nodes]]
            id = "stage-0"
            address = "192.168.1.22:19001"
            role = "pipeline_stage"
            stage = 0

            [[nodes]]
            id = "stage-1"
            address = "192.168.1.24:19001"
            role = "pipeline_stage"
            stage = 1
        "#]],
    );
    // IPv6 addresses are bracketed.
    check(
        Some("0.0.22"),
        qwen35(),
        json!({"pipeline": {"node_id": "a", "host": "fd00::1", "port": 9100, "transport": "thunderbolt",
            "peers": [{"id": "b", "host": "fd00::2", "port": 9100},
                      {"id": "c", "host": "fd00::3", "port": 9100}]}}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --distributed-config $ROOT/work/distributed.toml --node-id a
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: pipeline peer 'b' (pipeline_stage): start it before this model loads, on the machine at fd00::2 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id b --no-warmup
            note: pipeline peer 'c' (pipeline_stage): start it before this model loads, on the machine at fd00::3 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id c --no-warmup
            file distributed.toml:
            # mlxcel-server --distributed-config for model 'm', written by Hangar's mlxcel plugin.
            # Schema *unconfirmed*: taken from mlxcel's public source (src/distributed/config.rs),
            # not from a release's documentation; see plugins/mlxcel/README.md.

            [cluster]
            name = "hangar-m"
            pipeline_parallel_size = 2
            transport_backend = "thunderbolt"

            [[nodes]]
            id = "a"
            address = "[fd00::1]:9100"
            role = "hybrid"

            [[nodes]]
            id = "b"
            address = "[fd00::2]:9100"
            role = "pipeline_stage"
            stage = 0

            [[nodes]]
            id = "c"
            address = "[fd00::3]:9100"
            role = "pipeline_stage"
            stage = 1
        "#]],
    );
    check(
        Some("0.0.21"),
        qwen35(),
        two_stages(),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: setting 'pipeline' was not applied, the model is served on this machine alone: plugin 'mlxcel' needs mlxcel-server >=0.0.22 for distributed_pipeline; found 0.0.21
        "#]],
    );
}

#[test]
fn split_prefill_decode_roles_need_0_2_0() {
    let split = json!({"pipeline": {"node_id": "router", "host": "10.0.0.1", "port": 9100, "role": "router",
        "peers": [{"id": "p", "host": "10.0.0.2", "port": 9100, "role": "prefill"},
                  {"id": "d", "host": "10.0.0.3", "port": 9100, "role": "decode"}]}});
    check(
        Some("0.0.26"),
        qwen35(),
        split.clone(),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: node 'router' has role 'router': plugin 'mlxcel' needs mlxcel-server >=0.2.0 for split_prefill_decode; found 0.0.26
        "#]],
    );
    check(
        Some("0.4.2"),
        qwen35(),
        split,
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --distributed-config $ROOT/work/distributed.toml --node-id router --node-role router
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
            note: pipeline peer 'p' (prefill): start it before this model loads, on the machine at 10.0.0.2 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id p --node-role prefill --no-warmup
            note: pipeline peer 'd' (decode): start it before this model loads, on the machine at 10.0.0.3 with the same model folder and a copy of $ROOT/work/distributed.toml (it changes only with the pipeline setting) in its working folder: mlxcel-server --model $ROOT/target --distributed-config distributed.toml --node-id d --node-role decode --no-warmup
            file distributed.toml:
            # mlxcel-server --distributed-config for model 'm', written by Hangar's mlxcel plugin.
            # Schema *unconfirmed*: taken from mlxcel's public source (src/distributed/config.rs),
            # not from a release's documentation; see plugins/mlxcel/README.md.

            [cluster]
            name = "hangar-m"
            pipeline_parallel_size = 1
            transport_backend = "tcp"

            [[nodes]]
            id = "router"
            address = "10.0.0.1:9100"
            role = "router"

            [[nodes]]
            id = "p"
            address = "10.0.0.2:9100"
            role = "prefill"

            [[nodes]]
            id = "d"
            address = "10.0.0.3:9100"
            role = "decode"
        "#]],
    );
}

#[test]
fn invalid_pipelines_are_refused_with_what_to_fix() {
    let refused = |pipeline: Value, expected: Expect| {
        check(
            Some("0.4.2"),
            qwen35(),
            json!({ "pipeline": pipeline }),
            expected,
        )
    };
    let peer = json!({"id": "b", "host": "10.0.0.2", "port": 9100});
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 9100, "peers": []}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: it needs a non-empty 'peers' list: a pipeline spans at least two nodes
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "studio.local", "port": 9100, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline 'a': host must be an IP address, not 'studio.local'; mlxcel reads node addresses as IP:port, not names
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "0.0.0.0", "port": 9100, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline 'a': host 0.0.0.0 is not an address peers can reach; give the machine's own IP address
        "#]],
    );
    refused(
        json!({"node_id": "b", "host": "10.0.0.1", "port": 9100, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: node id 'b' is used twice
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.2", "port": 9100, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: nodes 'a' and 'b' both listen on 10.0.0.2:9100
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 9100,
               "peers": [{"id": "b", "host": "10.0.0.1", "port": 9101, "http_port": 9100}]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: peer 'b': http_port 9100 is taken by node 'a' on 10.0.0.1
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 70000, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline 'a': port must be a port between 1 and 65535, not 70000
        "#]],
    );
    refused(
        json!({"node_id": "a b", "host": "10.0.0.1", "port": 9100, "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline: node_id must be 1 to 128 letters, digits, '-', '_' or '.', not 'a b'
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 9100, "peers": [{"id": "b", "host": "10.0.0.2", "port": 1, "layer": "0-27"}]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: peer 1 has no field 'layer' (its fields: id, host, port, role, layers, http_port)
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 9100, "role": "leader", "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline 'a': role must be one of hybrid, pipeline_stage, prefill, decode, router, not 'leader'
        "#]],
    );
    refused(
        json!({"node_id": "a", "host": "10.0.0.1", "port": 9100, "transport": "rdma", "peers": [peer]}),
        expect![[r#"
            error: model 'm': setting pipeline is invalid: transport must be tcp or thunderbolt, not 'rdma'
        "#]],
    );
    // Layer partitions: one range per stage, from layer 0, no gaps, and
    // the model's own layer count when its config.json gives it (28).
    for (layers, expected) in [
        (
            "0-13,15-27",
            expect![[r#"
                error: model 'm': setting pipeline is invalid: layers '0-13,15-27': with --distributed-config mlxcel-server partitions the layers across its stages itself and refuses --pp-layers; leave 'layers' out of the node and its peers
            "#]],
        ),
        (
            "0-27",
            expect![[r#"
                error: model 'm': setting pipeline is invalid: layers '0-27': with --distributed-config mlxcel-server partitions the layers across its stages itself and refuses --pp-layers; leave 'layers' out of the node and its peers
            "#]],
        ),
        (
            "0-13,14-30",
            expect![[r#"
                error: model 'm': setting pipeline is invalid: layers '0-13,14-30': with --distributed-config mlxcel-server partitions the layers across its stages itself and refuses --pp-layers; leave 'layers' out of the node and its peers
            "#]],
        ),
        (
            "0-13;14-27",
            expect![[r#"
                error: model 'm': setting pipeline is invalid: layers '0-13;14-27': with --distributed-config mlxcel-server partitions the layers across its stages itself and refuses --pp-layers; leave 'layers' out of the node and its peers
            "#]],
        ),
    ] {
        let mut pipeline = two_stages()["pipeline"].clone();
        pipeline["layers"] = json!(layers);
        refused(pipeline, expected);
    }
    let mut both = two_stages()["pipeline"].clone();
    both["peers"][1]["layers"] = json!("14-27");
    refused(
        both,
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline stage 'stage-0' has no layers while other peers do; give each stage peer its range, or the whole partition in 'layers'
        "#]],
    );
    let mut some = two_stages()["pipeline"].clone();
    some.as_object_mut().unwrap().remove("layers");
    some["peers"][1]["layers"] = json!("14-27");
    refused(
        some,
        expect![[r#"
            error: model 'm': setting pipeline is invalid: pipeline stage 'stage-0' has no layers while other peers do; give each stage peer its range, or the whole partition in 'layers'
        "#]],
    );
}

fn check_probe(run: Option<ProbeRun>, expected: Expect) {
    let ProbeReport {
        available,
        version,
        program,
        device,
        detail,
        ..
    } = probe(&ProbeInput::new(run));
    expected.assert_eq(&format!(
        "available: {available}\nversion: {version:?}\nprogram: {program:?}\ndevice: {device:?}\ndetail: {}\n",
        detail.unwrap_or_default()
    ));
}

fn exited(code: i32, stdout: &str, stderr: &str) -> Option<ProbeRun> {
    Some(ProbeRun::exited(BIN, Some(code), stdout, stderr))
}

#[test]
fn probe_reads_clap_version_lines() {
    check_probe(
        exited(0, "mlxcel-server 0.4.2\n", ""),
        expect![[r#"
            available: true
            version: Some("0.4.2")
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: 
        "#]],
    );
    check_probe(
        exited(
            0,
            "2026-11-30T10:00:00Z INFO starting\nmlxcel-server v0.0.26 (3f2a1c0)\n",
            "",
        ),
        expect![[r#"
            available: true
            version: Some("0.0.26")
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: 
        "#]],
    );
}

#[test]
fn an_unreadable_failing_or_hanging_probe_keeps_the_engine_with_capabilities_off() {
    check_probe(
        exited(0, "mlxcel-server nightly-20261130\n", ""),
        expect![[r#"
            available: true
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: version 'nightly-20261130' is not semver; the version is unknown, so every capability gated on the version is off
        "#]],
    );
    check_probe(
        exited(0, "hello\n", ""),
        expect![[r#"
            available: true
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: could not read a version from `/opt/bin/mlxcel-server --version` ("hello"); the version is unknown, so every capability gated on the version is off
        "#]],
    );
    check_probe(
        exited(1, "", "error: Metal device not found\n\n"),
        expect![[r#"
            available: true
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: `/opt/bin/mlxcel-server --version` failed (exit code 1): error: Metal device not found; the version is unknown, so every capability gated on the version is off
        "#]],
    );
    check_probe(
        Some(ProbeRun::timed_out(BIN, 5000)),
        expect![[r#"
            available: true
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: `/opt/bin/mlxcel-server --version` did not answer within 5000 ms; the version is unknown, so every capability gated on the version is off
        "#]],
    );
}

#[test]
fn an_engine_that_cannot_run_is_unavailable_with_install_advice() {
    check_probe(
        Some(ProbeRun::not_found(["PATH", "~/.local/bin/mlxcel-server"])),
        expect![[r#"
            available: false
            version: None
            program: None
            device: None
            detail: mlxcel-server is not installed (looked in PATH, ~/.local/bin/mlxcel-server). Download mlxcel-server from https://github.com/lablup/mlxcel/releases: the macOS arm64 (Metal) build, or mlxcel-server-linux-aarch64-cuda13 / mlxcel-server-linux-x86_64-cuda13 on Linux. A release is a zip: unpack it whole and keep the binary beside what it loads (mlx.metallib on macOS; on Linux the bin/ folder with ../include/cccl, ../include/cute and ../include/cutlass), then point Hangar at the unpacked binary with `[plugins.mlxcel] program = "/path/to/mlxcel-server"` in config.toml, or link it into PATH or ~/.local/bin
        "#]],
    );
    check_probe(
        Some(ProbeRun::failed_to_start(
            BIN,
            "Exec format error (os error 8)",
        )),
        expect![[r#"
            available: false
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: /opt/bin/mlxcel-server could not be started (Exec format error (os error 8)); if it is a build for another platform, replace it. Download mlxcel-server from https://github.com/lablup/mlxcel/releases: the macOS arm64 (Metal) build, or mlxcel-server-linux-aarch64-cuda13 / mlxcel-server-linux-x86_64-cuda13 on Linux. A release is a zip: unpack it whole and keep the binary beside what it loads (mlx.metallib on macOS; on Linux the bin/ folder with ../include/cccl, ../include/cute and ../include/cutlass), then point Hangar at the unpacked binary with `[plugins.mlxcel] program = "/path/to/mlxcel-server"` in config.toml, or link it into PATH or ~/.local/bin
        "#]],
    );
}

#[test]
fn describe_agrees_with_the_manifest_and_every_setting_is_mapped() {
    let manifest = manifest().expect("plugin.toml parses");
    let description = Mlxcel::describe();
    let mut capabilities = description.capabilities.clone();
    capabilities.sort();
    assert_eq!(description.id, manifest.id);
    assert_eq!(description.version, manifest.version.to_string());
    assert_eq!(description.formats, manifest.formats);
    assert_eq!(description.aliases, manifest.aliases);
    assert_eq!(
        capabilities,
        manifest.capabilities.keys().cloned().collect::<Vec<_>>()
    );
    let elsewhere = [
        "draft_model",
        drafter::DRAFT_KIND,
        "draft_tokens",
        drafter::DRAFT_BLOCK_SIZE,
        "pipeline",
        START_TIMEOUT_MS,
    ];
    for s in &manifest.settings {
        assert!(
            FLAGS.iter().any(|f| f.setting == s.name) || elsewhere.contains(&s.name.as_str()),
            "setting '{}' is declared but never mapped",
            s.name
        );
    }
    for name in FLAGS.iter().map(|f| f.setting).chain(elsewhere) {
        assert!(
            manifest.setting(name).is_some(),
            "'{name}' is mapped but not declared"
        );
    }
}

/// mlxcel splits one `--ctx-size` across its `--parallel` slots (4 by
/// default from 0.4.0, 1 before) and refuses fewer than 512 per slot: the
/// plan multiplies, says the slot count, and refuses a short context before
/// launch. Prompt cache off is `--no-prompt-cache` only from 0.4.0.
#[test]
fn the_context_is_per_slot_and_the_plan_sizes_the_total() {
    check(
        Some("0.4.2"),
        json!({}),
        json!({"context_length": 8192, "prompt_cache": false}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --no-prompt-cache -c 32768 --parallel 4
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
    check(
        Some("0.3.3"),
        json!({}),
        json!({"context_length": 8192, "prompt_cache": false}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --prompt-cache-enabled=false -c 8192 --parallel 1
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
    // Before 0.0.30 each slot had the whole --ctx-size, and nothing
    // below 512 was refused.
    check(
        Some("0.0.29"),
        json!({}),
        json!({"context_length": 256, "parallel": 2}),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 -c 256 --parallel 2
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
    check(
        Some("0.4.2"),
        json!({}),
        json!({"context_length": 511, "parallel": 2}),
        expect![[r#"
            error: model 'm': setting context_length = 511 is invalid: mlxcel-server refuses fewer than 512 tokens per slot
        "#]],
    );
}

/// A Linux CUDA build whose libraries are missing exits 127 at the probe:
/// unavailable, with the advice to unpack the release zip whole.
#[test]
fn a_build_missing_its_libraries_is_unavailable() {
    check_probe(
        exited(
            127,
            "",
            "mlxcel-server: error while loading shared libraries: libcublas.so.13: cannot open shared object file: No such file or directory",
        ),
        expect![[r#"
            available: false
            version: None
            program: Some("/opt/bin/mlxcel-server")
            device: None
            detail: `/opt/bin/mlxcel-server --version` exited 127, its libraries missing (mlxcel-server: error while loading shared libraries: libcublas.so.13: cannot open shared object file: No such file or directory). Download mlxcel-server from https://github.com/lablup/mlxcel/releases: the macOS arm64 (Metal) build, or mlxcel-server-linux-aarch64-cuda13 / mlxcel-server-linux-x86_64-cuda13 on Linux. A release is a zip: unpack it whole and keep the binary beside what it loads (mlx.metallib on macOS; on Linux the bin/ folder with ../include/cccl, ../include/cute and ../include/cutlass), then point Hangar at the unpacked binary with `[plugins.mlxcel] program = "/path/to/mlxcel-server"` in config.toml, or link it into PATH or ~/.local/bin
        "#]],
    );
}

/// What [`probe`] reads from a version run and a surface run: the version,
/// the options (or the detail saying why there are none).
fn check_surface(surface: ProbeRun, expected: Expect) {
    let input = ProbeInput::new(exited(0, "mlxcel-server 0.7.0\n", "")).with_surface(Some(surface));
    let report = probe(&input);
    expected.assert_eq(&format!(
        "version: {:?}\nflags: {:?}\ndetail: {}\n",
        report.version,
        report.flags,
        report.detail.unwrap_or_default()
    ));
}

#[test]
fn the_flag_surface_is_read_from_the_dump_or_from_help() {
    // The layout of src/cli/flag_surface.rs (schema 1), abridged.
    let dump = json!({
        "schema_version": 1,
        "binary": "mlxcel-server",
        "args": [
            {"id": "apc_enabled", "long": "apc-enabled", "long_aliases": [], "short": null,
             "short_aliases": [], "env": null, "defaults": ["true"], "hidden": false,
             "takes_value": true, "heading": null},
            {"id": "ctx_size", "long": "ctx-size", "long_aliases": [], "short": "c",
             "short_aliases": [], "env": "LLAMA_ARG_CTX_SIZE", "defaults": [], "hidden": false,
             "takes_value": true, "heading": null},
            {"id": "model_draft", "long": "model-draft", "long_aliases": ["draft-model"],
             "short": null, "short_aliases": [], "env": null, "defaults": [], "hidden": false,
             "takes_value": true, "heading": null},
            {"id": "n_gpu_layers", "long": "n-gpu-layers", "long_aliases": ["gpu-layers"],
             "short": null, "short_aliases": ["N"], "env": null, "defaults": [], "hidden": true,
             "takes_value": true, "heading": null}
        ]
    });
    check_surface(
        ProbeRun::exited(
            BIN,
            Some(0),
            serde_json::to_string_pretty(&dump).unwrap(),
            "",
        ),
        expect![[r#"
            version: Some("0.7.0")
            flags: Some(["--apc-enabled", "--ctx-size", "--draft-model", "--gpu-layers", "--model-draft", "--n-gpu-layers", "-N", "-c"])
            detail: 
        "#]],
    );
    // clap's help, as builds before the dump print it.
    let help = "\
Lablup mlxcel OpenAI-compatible server

Usage: mlxcel-server [OPTIONS]

Options:
  -m, --model <MODEL>                 Model folder (MLX checkpoint) [env: LLAMA_ARG_MODEL=]
  -c, --ctx-size <CTX_SIZE>           Context size, split across the --parallel slots
      --model-draft <MODEL_DRAFT>     Draft model folder [aliases: --draft-model]
      --apc-enabled[=<APC_ENABLED>]   Automatic prefix caching [default: true] [possible values: true, false]
      --no-warmup                     Skip the warmup run
  -h, --help                          Print help
  -V, --version                       Print version
";
    check_surface(
        ProbeRun::exited(BIN, Some(0), help, ""),
        expect![[r#"
            version: Some("0.7.0")
            flags: Some(["--apc-enabled", "--ctx-size", "--draft-model", "--help", "--model", "--model-draft", "--no-warmup", "--version", "-V", "-c", "-h", "-m"])
            detail: 
        "#]],
    );
}

#[test]
fn a_surface_that_cannot_be_read_leaves_capabilities_on_the_version() {
    check_surface(
        ProbeRun::exited(
            BIN,
            Some(2),
            "",
            "error: unexpected argument '--help' found\n",
        ),
        expect![[r#"
            version: Some("0.7.0")
            flags: None
            detail: neither `/opt/bin/mlxcel-server --dump-flag-surface` nor `/opt/bin/mlxcel-server --help` succeeded, so capabilities follow its version
        "#]],
    );
    check_surface(
        ProbeRun::exited(BIN, Some(0), r#"{"schema_version": 2, "args": []}"#, ""),
        expect![[r#"
            version: Some("0.7.0")
            flags: None
            detail: its --dump-flag-surface has schema_version 2, and this plugin reads 1, so capabilities follow its version
        "#]],
    );
    check_surface(
        ProbeRun::timed_out(BIN, 5000),
        expect![[r#"
            version: Some("0.7.0")
            flags: None
            detail: its command-line surface could not be read (the run did not finish), so capabilities follow its version
        "#]],
    );
}

#[test]
fn the_prompt_cache_is_turned_off_in_the_spelling_the_binary_parses() {
    let with = |flags: &'static [&'static str]| {
        move |r: &mut LoadRequest| r.engine = r.engine.clone().with_flags(flags.iter().copied())
    };
    // 0.4.2 by its version, yet a build without --no-prompt-cache.
    check_request(
        Some("0.4.2"),
        qwen35(),
        json!({"prompt_cache": false}),
        with(&[
            "--prompt-cache-enabled",
            "--model",
            "--alias",
            "--host",
            "--port",
        ]),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --prompt-cache-enabled=false
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
    // 0.0.25 by its version, yet a build that has it.
    check_request(
        Some("0.0.25"),
        qwen35(),
        json!({"prompt_cache": false}),
        with(&["--prompt-cache-enabled", "--no-prompt-cache"]),
        expect![[r#"
            /opt/bin/mlxcel-server --model $ROOT/target --alias m --host 127.0.0.1 --port 9000 --no-prompt-cache
            ready: GET /health -> 200, failed [503], warmup None, within 300000 ms; upstream model Some("m")
        "#]],
    );
}

#[test]
fn every_option_a_capability_needs_is_one_the_stand_in_has() {
    // The manifest's [flag_surface.capabilities] name options of
    // mlxcel-server; the stand-in (tests/stand-ins/mlxcel_server.py) is
    // rebuilt from its source, so each must be one of its flags.
    let stand_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/stand-ins/mlxcel_server.py"),
    )
    .unwrap();
    let manifest = manifest().unwrap();
    for (capability, options) in &manifest.flag_surface.capabilities {
        for option in options {
            assert!(
                stand_in.contains(&format!("\"{option}\"")),
                "{capability}: {option} is not a flag of the stand-in"
            );
        }
    }
}
