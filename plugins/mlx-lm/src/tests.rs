//! Tests of the plugin's behaviour: what it reads from probe output and the
//! exact command line it plans for each set of settings and capabilities.
//!
//! Update the snapshots with `UPDATE_EXPECT=1 cargo test -p hangar-plugin-mlx-lm`.

use expect_test::{expect, Expect};
use hangar_sdk::wire::{LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun};
use hangar_sdk::Plugin;
use serde_json::{json, Value};

use super::*;

const PY: &str = "/venv/bin/python";

/// This crate's folder stands in for a model folder (it exists on every
/// machine that builds the tests); snapshots show it as `$CRATE`.
const CRATE: &str = env!("CARGO_MANIFEST_DIR");

fn exited(code: i32, stdout: &str, stderr: &str) -> ProbeRun {
    ProbeRun::exited(PY, Some(code), stdout, stderr)
}

fn check_probe(run: ProbeRun, expect: Expect) {
    let report = probe(&ProbeInput::new(Some(run)));
    let ProbeReport {
        available,
        version,
        program,
        device,
        detail,
        ..
    } = report;
    let actual = format!(
        "available: {available}\nversion: {version:?}\nprogram: {program:?}\ndevice: {device:?}\ndetail: {}\n",
        detail.unwrap_or_default()
    );
    expect.assert_eq(&actual);
}

#[test]
fn probe_reads_version_and_device() {
    check_probe(
        exited(0, "mlx_lm 0.32.2\ndevice Device(cpu, 0)\n", ""),
        expect![[r#"
            available: true
            version: Some("0.32.2")
            program: Some("/venv/bin/python")
            device: Some("cpu")
            detail: 
        "#]],
    );
    // A deprecation warning on stderr and a GPU build, as on the CUDA host.
    check_probe(
        exited(
            0,
            "mlx_lm 0.31.1\ndevice Device(gpu, 0)\n",
            "FutureWarning: something\n",
        ),
        expect![[r#"
            available: true
            version: Some("0.31.1")
            program: Some("/venv/bin/python")
            device: Some("gpu")
            detail: 
        "#]],
    );
}

#[test]
fn probe_turns_an_import_error_into_install_advice() {
    // What the manifest's snippet prints under a Python without mlx_lm.
    check_probe(
        exited(1, "", "ModuleNotFoundError: No module named 'mlx_lm'\n"),
        expect![[r#"
            available: false
            version: None
            program: Some("/venv/bin/python")
            device: None
            detail: /venv/bin/python cannot import mlx_lm and mlx (ModuleNotFoundError: No module named 'mlx_lm'). Install them into that interpreter (`/venv/bin/python -m pip install "mlx[cpu]" mlx-lm` on Linux, `mlx[cuda13]` or `mlx[cuda12]` for NVIDIA GPUs, plain `mlx-lm` on macOS), or point Hangar at a Python that has them: `[plugins.mlx-lm] program = "/path/to/venv/bin/python"` in config.toml
        "#]],
    );
    // Plain `pip install mlx` on Linux: the package is there, libmlx.so is not.
    check_probe(
        exited(
            1,
            "",
            "Traceback (most recent call last):\n  File \"<string>\", line 1\nImportError: libmlx.so: cannot open shared object file: No such file or directory\n",
        ),
        expect![[r#"
            available: false
            version: None
            program: Some("/venv/bin/python")
            device: None
            detail: /venv/bin/python cannot import mlx_lm and mlx (ImportError: libmlx.so: cannot open shared object file: No such file or directory). Install them into that interpreter (`/venv/bin/python -m pip install "mlx[cpu]" mlx-lm` on Linux, `mlx[cuda13]` or `mlx[cuda12]` for NVIDIA GPUs, plain `mlx-lm` on macOS), or point Hangar at a Python that has them: `[plugins.mlx-lm] program = "/path/to/venv/bin/python"` in config.toml
        "#]],
    );
}

#[test]
fn probe_failures_other_than_imports_keep_the_sdk_wording() {
    check_probe(
        exited(2, "", "Fatal Python error: init_fs_encoding\n"),
        expect![[r#"
            available: false
            version: None
            program: None
            device: None
            detail: /venv/bin/python exited with code 2 while probing: Fatal Python error: init_fs_encoding
        "#]],
    );
    check_probe(
        ProbeRun::not_found(["PATH", "~/.venv/bin/python3"]),
        expect![[r#"
            available: false
            version: None
            program: None
            device: None
            detail: not installed (looked in PATH, ~/.venv/bin/python3)
        "#]],
    );
}

#[test]
fn probe_with_an_unreadable_version_keeps_the_engine_with_capabilities_off() {
    check_probe(
        exited(0, "mlx_lm 0.33.0.dev20261101\ndevice Device(cpu, 0)\n", ""),
        expect![[r#"
            available: true
            version: None
            program: Some("/venv/bin/python")
            device: Some("cpu")
            detail: version '0.33.0.dev20261101' is not MAJOR[.MINOR[.PATCH]][-PRE]; version unknown, gated capabilities off
        "#]],
    );
    check_probe(
        exited(0, "hello\n", ""),
        expect![[r#"
            available: true
            version: None
            program: Some("/venv/bin/python")
            device: None
            detail: could not read a version from /venv/bin/python's output ("hello"); gated capabilities off
        "#]],
    );
    check_probe(
        ProbeRun::timed_out(PY, 20000),
        expect![[r#"
            available: true
            version: None
            program: Some("/venv/bin/python")
            device: None
            detail: /venv/bin/python did not print its version within 20000 ms; version unknown, gated capabilities off
        "#]],
    );
}

/// Every capability this plugin declares.
const ALL: &[&str] = &[
    SAMPLING_DEFAULTS,
    SPECULATIVE,
    CHAT_TEMPLATE_ARGS,
    PROMPT_CACHE,
    KV_CACHE_QUANTIZATION,
];

/// Plans a launch of `$CRATE` on a probed mlx-lm `version` with
/// `capabilities` on and `settings` (JSON, `$CRATE` expanded), and compares
/// the plan, or the error, with `expect`.
fn check_plan(version: Option<&str>, capabilities: &[&str], settings: Value, expect: Expect) {
    check_request(
        |r| {
            r.engine.version = version.map(str::to_string);
            r.capabilities = capabilities.iter().map(|c| c.to_string()).collect();
            r.settings = serde_json::from_str(&settings.to_string().replace("$CRATE", CRATE))
                .expect("settings are a JSON object");
        },
        expect,
    );
}

/// Plans a launch for a request that `edit` changes from a plain one.
fn check_request(edit: impl FnOnce(&mut LoadRequest), expect: Expect) {
    let mut request = request();
    edit(&mut request);
    let actual = match plan_launch(&request) {
        Ok(plan) => render(&plan),
        Err(error) => format!("error: {error}\n"),
    };
    expect.assert_eq(&actual.replace(CRATE, "$CRATE"));
}

/// A plain load request for `$CRATE` as an mlx model.
fn request() -> LoadRequest {
    LoadRequest::new("tiny", CRATE, "mlx")
        .with_accelerator("cpu")
        .with_engine(
            ProbeReport::available(Some("0.32.2".into()))
                .with_program(PY)
                .with_device("cpu"),
        )
        .with_endpoint("127.0.0.1", 8181)
        .with_work_dir("/work/s1")
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
    let env: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let ready = &plan.readiness;
    let warmup = ready
        .warmup
        .as_ref()
        .map(|w| format!(", then POST {} {}", w.path, w.body))
        .unwrap_or_default();
    let mut out = format!(
        "argv: {}\nenv: {}\ncwd: {:?}\nready: GET {} -> {}{warmup}, within {} ms\nprotocol: {:?}, upstream model: {:?}\n",
        argv.join(" "),
        env.join(" "),
        plan.cwd,
        ready.health_path,
        ready.ready_status,
        plan.start_timeout_ms,
        plan.protocol,
        plan.upstream_model,
    );
    for note in &plan.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    for rank in &plan.ranks {
        out.push_str(&format!(
            "rank {} on {} (local: {}, marked {:?})\n",
            rank.rank, rank.peer, rank.local, rank.env_marker
        ));
    }
    for (name, contents) in &plan.files {
        let compact: Value =
            serde_json::from_str(contents).unwrap_or(Value::String(contents.clone()));
        out.push_str(&format!("file {name}: {compact}\n"));
    }
    out
}

/// A cluster of this machine and one peer reached by ssh.
fn pair(mode: DistributedMode) -> Cluster {
    let peer = |name: &str, ssh: &str, ip: &str, local: bool| {
        let peer = hangar_sdk::wire::Peer::new(name, ssh, ip);
        assert_eq!(peer.local, local);
        peer
    };
    Cluster::new(
        "pair",
        mode,
        vec![
            peer("here", "127.0.0.1", "10.0.0.1", true),
            peer("studio", "me@studio", "10.0.0.2", false),
        ],
        40000,
    )
}

fn check_cluster(edit: impl FnOnce(&mut LoadRequest), expect: Expect) {
    check_request(
        |r| {
            r.capabilities = vec![DISTRIBUTED_TENSOR.into(), DISTRIBUTED_PIPELINE.into()];
            r.cluster = Some(pair(DistributedMode::Tensor));
            edit(r);
        },
        expect,
    );
}

#[test]
fn a_cluster_is_launched_by_mlx_launch_over_the_ring_with_one_rank_per_peer() {
    check_cluster(
        |_| {},
        expect![[r#"
            argv: /venv/bin/python -c 'import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; sys.exit(main())' --backend ring --hostfile /work/s1/hosts.json --starting-port 40000 --python /venv/bin/python --env HF_HUB_OFFLINE=1 --env PYTHONUNBUFFERED=1 -- -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: tensor parallel over 2 ranks of cluster 'pair' (mlx.launch, ring backend, ports 40000..=40001): rank 0 on here, rank 1 on studio
            rank 0 on here (local: true, marked Some("MLX_RANK=0"))
            rank 1 on studio (local: false, marked Some("MLX_RANK=1"))
            file hosts.json: {"backend":"ring","envs":[],"hosts":[{"ips":["10.0.0.1"],"ssh":"127.0.0.1"},{"ips":["10.0.0.2"],"ssh":"me@studio"}]}
        "#]],
    );
    // Pipeline mode adds the server's --pipeline.
    check_cluster(
        |r| r.cluster = Some(pair(DistributedMode::Pipeline)),
        expect![[r#"
            argv: /venv/bin/python -c 'import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; sys.exit(main())' --backend ring --hostfile /work/s1/hosts.json --starting-port 40000 --python /venv/bin/python --env HF_HUB_OFFLINE=1 --env PYTHONUNBUFFERED=1 -- -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181 --pipeline
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: pipeline parallel over 2 ranks of cluster 'pair' (mlx.launch, ring backend, ports 40000..=40001): rank 0 on here, rank 1 on studio
            rank 0 on here (local: true, marked Some("MLX_RANK=0"))
            rank 1 on studio (local: false, marked Some("MLX_RANK=1"))
            file hosts.json: {"backend":"ring","envs":[],"hosts":[{"ips":["10.0.0.1"],"ssh":"127.0.0.1"},{"ips":["10.0.0.2"],"ssh":"me@studio"}]}
        "#]],
    );
}

#[test]
fn a_cluster_the_engine_cannot_serve_is_refused() {
    // The mode's capability is off (mlx-lm before 0.31.1).
    check_cluster(
        |r| {
            r.engine.version = Some("0.30.4".into());
            r.capabilities = vec![DISTRIBUTED_TENSOR.into()];
            r.cluster = Some(pair(DistributedMode::Pipeline));
        },
        expect![[r#"
            error: model 'tiny': plugin 'mlx-lm' needs mlx-lm >=0.31.1 for distributed_pipeline (mlx.launch + mlx_lm.server); found 0.30.4
        "#]],
    );
    // Rank 0 serves HTTP on loopback: this machine must come first.
    check_cluster(
        |r| {
            let cluster = r.cluster.as_mut().expect("set");
            cluster.peers.swap(0, 1);
        },
        expect![[r#"
            error: model 'tiny': cluster 'pair' starts with peer 'studio', but rank 0 serves HTTP on this machine's loopback; put this machine (ssh = "127.0.0.1") first
        "#]],
    );
    // Pipelining reads the shard index, which a single-file checkpoint lacks.
    check_cluster(
        |r| {
            r.model_files = vec!["config.json".into(), "model.safetensors".into()];
            r.cluster = Some(pair(DistributedMode::Pipeline));
        },
        expect![[r#"
            error: model 'tiny': distributed = "pipeline" needs model.safetensors.index.json in the model folder (mlx-lm's pipeline loader reads it to give each rank its layers); the folder has none: convert the model with mlx_lm.convert, which writes it, or use distributed = "tensor"
        "#]],
    );
    // mlx_lm.server loads no draft model in a group.
    check_cluster(
        |r| {
            r.capabilities.push(SPECULATIVE.into());
            r.settings
                .insert(settings::DRAFT_MODEL.into(), json!(CRATE));
        },
        expect![[r#"
            error: model 'tiny': draft_model cannot be used with distributed = "tensor": mlx_lm.server loads no draft model in a distributed group; remove one of the two settings
        "#]],
    );
}

fn every_setting() -> Value {
    json!({
        "context_length": 4096,
        "max_tokens": 256,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "draft_model": "$CRATE/src",
        "draft_tokens": 4,
        "prompt_cache_size": 4,
        "kv_bits": 8,
        "chat_template_args": {"enable_thinking": false},
    })
}

#[test]
fn a_plain_model_gets_host_port_env_and_warmup() {
    check_plan(
        Some("0.32.2"),
        ALL,
        json!({}),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
        "#]],
    );
}

#[test]
fn every_setting_becomes_a_flag_when_every_capability_is_on() {
    check_plan(
        Some("0.32.2"),
        ALL,
        every_setting(),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181 --max-tokens 256 --temp 0.7 --top-p 0.9 --top-k 40 --min-p 0.05 --draft-model $CRATE/src --num-draft-tokens 4 --prompt-cache-size 4 --kv-bits 8 --chat-template-args '{"enable_thinking":false}'
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: context_length = 4096 is not applied: mlx_lm.server has no context-length flag; the model's own limit holds
            note: kv_bits: mlx_lm.server turns batching off while the KV cache is quantized, so it serves one request at a time
        "#]],
    );
}

#[test]
fn a_setting_whose_capability_is_off_is_dropped_with_a_note() {
    // 0.31.1 has the prompt cache but not --kv-bits.
    check_plan(
        Some("0.31.1"),
        &[
            SAMPLING_DEFAULTS,
            SPECULATIVE,
            CHAT_TEMPLATE_ARGS,
            PROMPT_CACHE,
        ],
        json!({"prompt_cache_size": 4, "kv_bits": 8, "top_k": 40}),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181 --top-k 40 --prompt-cache-size 4
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: kv_bits is not passed: plugin 'mlx-lm' needs mlx-lm >=0.32.0 for kv_cache_quantization (--kv-bits); found 0.31.1
        "#]],
    );
    // 0.23.0 has none of the flags, and no /health either.
    check_plan(
        Some("0.23.0"),
        &[],
        every_setting(),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /v1/models -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: context_length = 4096 is not applied: mlx_lm.server has no context-length flag; the model's own limit holds
            note: max_tokens is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--max-tokens); found 0.23.0
            note: temperature is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--temp); found 0.23.0
            note: top_p is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--top-p); found 0.23.0
            note: top_k is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--top-k); found 0.23.0
            note: min_p is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--min-p); found 0.23.0
            note: draft_model is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for speculative (--draft-model); found 0.23.0
            note: draft_tokens is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for speculative (--num-draft-tokens); found 0.23.0
            note: prompt_cache_size is not passed: plugin 'mlx-lm' needs mlx-lm >=0.31.1 for prompt_cache (--prompt-cache-size); found 0.23.0
            note: kv_bits is not passed: plugin 'mlx-lm' needs mlx-lm >=0.32.0 for kv_cache_quantization (--kv-bits); found 0.23.0
            note: chat_template_args is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for chat_template_args (--chat-template-args); found 0.23.0
        "#]],
    );
}

#[test]
fn an_unknown_version_passes_no_gated_flag_and_polls_a_route_every_release_has() {
    check_plan(
        None,
        &[],
        json!({"temperature": 0.2, "chat_template_args": {"x": 1}, "top_p": null}),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /v1/models -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: temperature is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for sampling_defaults (--temp); the engine's version is unknown
            note: chat_template_args is not passed: plugin 'mlx-lm' needs mlx-lm >=0.25.0 for chat_template_args (--chat-template-args); the engine's version is unknown
        "#]],
    );
}

#[test]
fn draft_tokens_without_a_draft_model_is_dropped() {
    check_plan(
        Some("0.32.2"),
        ALL,
        json!({"draft_tokens": 4, "draft_model": null}),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: draft_tokens is not passed: it does nothing without draft_model
        "#]],
    );
}

#[test]
fn invalid_setting_values_are_refused() {
    let check = |settings: Value, expect: Expect| check_plan(Some("0.32.2"), ALL, settings, expect);
    check(
        json!({"kv_bits": 3}),
        expect![[r#"
            error: model 'tiny': setting kv_bits = 3 is invalid: it must be 4 or 8
        "#]],
    );
    check(
        json!({"kv_bits": "8"}),
        expect![[r#"
            error: model 'tiny': setting kv_bits = "8" is invalid: it must be 4 or 8
        "#]],
    );
    check(
        json!({"draft_model": "mlx-community/Qwen3-0.6B-4bit"}),
        expect![[r#"
            error: model 'tiny': setting draft_model = "mlx-community/Qwen3-0.6B-4bit" is invalid: '$CRATE/mlx-community/Qwen3-0.6B-4bit' is not an existing folder; the engine runs offline, so it must be a local MLX model folder, not a hub name
        "#]],
    );
    check(
        json!({"draft_model": 7}),
        expect![[r#"
            error: model 'tiny': setting draft_model = 7 is invalid: it must be the path of a local model folder (a string)
        "#]],
    );
    check(
        json!({"temperature": -0.5}),
        expect![[r#"
            error: model 'tiny': setting temperature = -0.5 is invalid: it must be a number 0 or more (0 samples greedily)
        "#]],
    );
    check(
        json!({"top_p": 0}),
        expect![[r#"
            error: model 'tiny': setting top_p = 0 is invalid: it must be a number above 0 and at most 1
        "#]],
    );
    check(
        json!({"min_p": 1.5}),
        expect![[r#"
            error: model 'tiny': setting min_p = 1.5 is invalid: it must be a number from 0 to 1 (0 turns it off)
        "#]],
    );
    check(
        json!({"top_k": -1}),
        expect![[r#"
            error: model 'tiny': setting top_k = -1 is invalid: it must be a whole number, 0 or more (0 turns it off)
        "#]],
    );
    check(
        json!({"max_tokens": 0}),
        expect![[r#"
            error: model 'tiny': setting max_tokens = 0 is invalid: it must be a whole number above 0
        "#]],
    );
    check(
        json!({"prompt_cache_size": 2.5}),
        expect![[r#"
            error: model 'tiny': setting prompt_cache_size = 2.5 is invalid: it must be a whole number above 0
        "#]],
    );
    check(
        json!({"chat_template_args": "enable_thinking=false"}),
        expect![[r#"
            error: model 'tiny': setting chat_template_args = "enable_thinking=false" is invalid: it must be a JSON object of chat-template keyword arguments, e.g. {"enable_thinking": false}
        "#]],
    );
    check(
        json!({"start_timeout_ms": "soon"}),
        expect![[r#"
            error: model 'tiny': setting start_timeout_ms = "soon" is invalid: it must be a whole number of milliseconds above 0
        "#]],
    );
}

#[test]
fn an_invalid_value_of_a_capability_that_is_off_is_only_noted() {
    // The flag is never passed, so its value cannot hurt the load.
    check_plan(
        Some("0.31.1"),
        &[SAMPLING_DEFAULTS],
        json!({"kv_bits": 3}),
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 120000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: kv_bits is not passed: plugin 'mlx-lm' needs mlx-lm >=0.32.0 for kv_cache_quantization (--kv-bits); found 0.31.1
        "#]],
    );
}

#[test]
fn the_request_shapes_program_timeout_and_notes() {
    // No resolved program: the manifest's name; the start timeout from the
    // operator's plugin settings; a CUDA machine whose mlx is a CPU build.
    check_request(
        |r| {
            r.engine.program = None;
            r.accelerator = "cuda13".into();
            r.plugin_settings
                .insert(START_TIMEOUT_MS.into(), json!(300000));
        },
        expect![[r#"
            argv: python3 -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 300000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
            note: the host picked accelerator cuda13, but this interpreter's mlx runs on the cpu; install "mlx[cuda13]" into the interpreter to use the GPU
        "#]],
    );
    // A per-model start timeout wins over the plugin's.
    check_request(
        |r| {
            r.engine.device = Some("gpu".into());
            r.accelerator = "cuda13".into();
            r.plugin_settings
                .insert(START_TIMEOUT_MS.into(), json!(300000));
            r.settings.insert(START_TIMEOUT_MS.into(), json!(5000));
        },
        expect![[r#"
            argv: /venv/bin/python -m mlx_lm.server --model $CRATE --host 127.0.0.1 --port 8181
            env: HF_HUB_CACHE=/work/s1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
            cwd: None
            ready: GET /health -> 200, then POST /v1/completions {"max_tokens":1,"prompt":"hi"}, within 5000 ms
            protocol: OpenaiHttp, upstream model: Some("$CRATE")
        "#]],
    );
}

#[test]
fn a_model_that_is_not_an_mlx_folder_is_refused() {
    check_request(
        |r| r.model_path = format!("{CRATE}/missing"),
        expect![[r#"
            error: model 'tiny': the model path '$CRATE/missing' is not an existing folder; mlx_lm.server serves an MLX model folder (config.json, tokenizer, *.safetensors)
        "#]],
    );
    check_request(
        |r| r.format = "exl2".into(),
        expect![[r#"
            error: model 'tiny': plugin 'mlx-lm' serves the 'mlx' and 'gguf' formats, not 'exl2'
        "#]],
    );
}

#[test]
fn a_gguf_model_is_served_as_its_one_file() {
    let dir = std::env::temp_dir().join(format!("mlx-lm-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tiny.gguf"), b"GGUF").unwrap();
    let folder = dir.display().to_string();
    let plan = plan_launch(&{
        let mut request = request();
        request.format = "gguf".into();
        request.model_path = folder.clone();
        request
    })
    .expect("a folder with one gguf file is served");
    assert_eq!(
        plan.args[2..4],
        ["--model".to_string(), format!("{folder}/tiny.gguf")]
    );
    std::fs::write(dir.join("other.gguf"), b"GGUF").unwrap();
    let refused = plan_launch(&{
        let mut request = request();
        request.format = "gguf".into();
        request.model_path = folder.clone();
        request
    })
    .unwrap_err();
    assert!(refused.contains("holds 2 *.gguf files"), "{refused}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn describe_agrees_with_the_manifest() {
    let manifest = manifest().expect("plugin.toml parses");
    let description = MlxLm::describe();
    let mut formats = description.formats.clone();
    formats.sort();
    let mut capabilities = description.capabilities.clone();
    capabilities.sort();
    assert_eq!(description.id, manifest.id);
    assert_eq!(description.version, manifest.version.to_string());
    let mut declared = manifest.formats.clone();
    declared.sort();
    assert_eq!(formats, declared);
    assert_eq!(description.aliases, manifest.aliases);
    assert_eq!(
        capabilities,
        manifest.capabilities.keys().cloned().collect::<Vec<_>>()
    );
    // Every flag's capability is one the plugin declares.
    for flag in FLAGS {
        assert!(
            manifest.capabilities.contains_key(flag.capability),
            "{} is gated on undeclared {}",
            flag.flag,
            flag.capability
        );
    }
}

#[test]
fn gguf_is_declared_for_macos_arm64_only() {
    let manifest = manifest().expect("plugin.toml parses");
    let serving: Vec<String> = manifest
        .platforms
        .iter()
        .filter(|p| p.serves("gguf"))
        .map(|p| format!("{}/{}", p.os, p.arch))
        .collect();
    assert_eq!(serving, ["macos/aarch64"]);
    assert!(manifest.platforms.iter().all(|p| p.serves("mlx")));
}
