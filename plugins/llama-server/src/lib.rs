//! `llama-server`: a Hangar engine plugin for llama.cpp's `llama-server`,
//! which serves the OpenAI HTTP API for GGUF models.
//!
//! Built for `wasm32-unknown-unknown`, it runs in the host's sandbox: it
//! reads what the host's probe found (`llama-server --version`), plans the
//! server for each model, and rewrites one request field the server reads
//! under another name. It never touches the disk: the host lists the
//! model's files in the load request.

use hangar_sdk::serde_json::Value;
use hangar_sdk::wire::{
    Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun, Readiness,
    WarmupRequest,
};
use hangar_sdk::{export_plugin, Plugin};

/// The engine program, declared under `programs` in plugin.toml.
const PROGRAM: &str = "llama-server";

/// The plugin: pure functions from what the host sends to what it needs.
pub struct LlamaServer;

impl Plugin for LlamaServer {
    fn describe() -> Description {
        hangar_sdk::describe!("llama-server", formats: ["gguf"], capabilities: ["tool_calls", "structured_output", "embeddings", "prompt_lists", "vision"])
    }

    /// `llama-server --version` prints `version: 4589 (1d1e6a90)` for a
    /// release (llama.cpp numbers releases b4589; as semver, 4589.0.0) and
    /// `version: 0.6.0-dev (build 0, …)` for a source build.
    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        let mut report = hangar_sdk::version_from_output(&input, |_| None);
        if let Some(ProbeRun::Exited { stdout, stderr, .. }) = &input.run {
            if let Some(version) = parse_version(stdout).or_else(|| parse_version(stderr)) {
                report.version = Some(version);
                report.detail = None;
            }
        }
        Ok(report)
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let model = model_file(&request)?;
        let setting = |name: &str| request.settings.get(name).and_then(Value::as_u64);
        let mut args = vec![
            "--model".to_string(),
            model,
            "--host".into(),
            request.host.clone(),
            "--port".into(),
            request.port.to_string(),
            // Clients name the model by its Hangar id; so does the server.
            "--alias".into(),
            request.model_id.clone(),
            // The GGUF's own chat template, rendered by llama.cpp's Jinja
            // engine (what tool calls need).
            "--jinja".into(),
        ];
        if let Some(projector) = projector_file(&request) {
            args.extend(["--mmproj".into(), projector]);
        }
        // An embedding model (the host read its pooling type or encoder
        // architecture from the GGUF) is served for /v1/embeddings alone,
        // pooled and normalised as the GGUF says; its warm-up embeds.
        let embedder = request.model_kind.as_deref() == Some("embedding");
        if embedder {
            args.push("--embeddings".into());
        }
        if let Some(tokens) = setting("context_length") {
            args.extend(["--ctx-size".into(), tokens.to_string()]);
        }
        let on_gpu = request.accelerator != "cpu";
        let layers = setting("gpu_layers").unwrap_or(if on_gpu { 999 } else { 0 });
        args.extend(["--n-gpu-layers".into(), layers.to_string()]);
        if let Some(threads) = setting("threads") {
            args.extend(["--threads".into(), threads.to_string()]);
        }
        if let Some(slots) = setting("parallel") {
            args.extend(["--parallel".into(), slots.to_string()]);
        }
        Ok(
            // The path the probe resolved, else the declared name.
            LaunchPlan::new(
                request.engine.program.unwrap_or_else(|| PROGRAM.into()),
                args,
            )
            // One token through the whole path before the first client.
            // Builds from llama.cpp #5548 (February 2024) on can answer
            // 503 "no slot available" while every slot is taken (later
            // builds report that on /slots?fail_on_no_slot=1 instead):
            // full, not failed.
            .with_readiness(
                // 503 while the model loads, 200 once it serves.
                Readiness::new("/health")
                    .with_warmup(match embedder {
                        true => WarmupRequest::new(
                            "/v1/embeddings",
                            hangar_sdk::serde_json::json!({
                                "model": request.model_id,
                                "input": "Hello",
                            }),
                        ),
                        false => WarmupRequest::new(
                            "/v1/completions",
                            hangar_sdk::serde_json::json!({
                                "model": request.model_id,
                                "prompt": "Hello",
                                "max_tokens": 1,
                            }),
                        ),
                    })
                    .with_busy_statuses(vec![503]),
            )
            .with_start_timeout_ms(300_000)
            .with_upstream_model(request.model_id.clone())
            .with_notes(vec![format!(
                "llama-server with {layers} layers on the GPU"
            )]),
        )
    }

    /// Two fields llama-server reads otherwise than OpenAI writes them:
    /// the newer `max_completion_tokens` is its `max_tokens` (a request
    /// that sends only the former keeps its limit), and it reads
    /// `tool_choice` as a string only (an object silently becomes
    /// `"auto"`), so a named function becomes `"required"` with that tool
    /// alone, which its grammar then enforces.
    fn map_request(_route: &str, mut body: Value) -> Result<Option<Value>, String> {
        let Some(object) = body.as_object_mut() else {
            return Ok(None);
        };
        let mut changed = false;
        if !object.contains_key("max_tokens") {
            if let Some(limit) = object.remove("max_completion_tokens") {
                object.insert("max_tokens".into(), limit);
                changed = true;
            }
        }
        let named = object
            .get("tool_choice")
            .and_then(|c| c.pointer("/function/name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(name) = named {
            if let Some(Value::Array(tools)) = object.get_mut("tools") {
                tools
                    .retain(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(&name));
            }
            object.insert("tool_choice".into(), Value::from("required"));
            changed = true;
        }
        Ok(changed.then_some(body))
    }
}

/// The version in `llama-server --version`'s output, as semver.
fn parse_version(output: &str) -> Option<String> {
    let word = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("version:"))?
        .split_whitespace()
        .next()?;
    if word.chars().all(|c| c.is_ascii_digit()) {
        return Some(format!("{}.0.0", word.parse::<u64>().ok()?));
    }
    Some(word.to_string())
}

/// The GGUF file to load: the model itself when the host found a `.gguf`
/// file, else the first `.gguf` of its folder that is not a multimodal
/// projector (for a split model, `…-00001-of-000NN.gguf`, which names the
/// rest).
fn model_file(request: &LoadRequest) -> Result<String, String> {
    if request.model_path.ends_with(".gguf") {
        return Ok(request.model_path.clone());
    }
    request
        .model_files
        .iter()
        .filter(|f| f.ends_with(".gguf") && !is_projector(f))
        .min()
        .map(|f| format!("{}/{f}", request.model_path.trim_end_matches('/')))
        .ok_or_else(|| {
            format!(
                "the model folder {} holds no .gguf file (it has: {})",
                request.model_path,
                request.model_files.join(", ")
            )
        })
}

/// A multimodal projector beside the weights (`mmproj-….gguf`).
fn projector_file(request: &LoadRequest) -> Option<String> {
    if request.model_path.ends_with(".gguf") {
        return None;
    }
    request
        .model_files
        .iter()
        .filter(|f| f.ends_with(".gguf") && is_projector(f))
        .min()
        .map(|f| format!("{}/{f}", request.model_path.trim_end_matches('/')))
}

fn is_projector(file: &str) -> bool {
    file.to_ascii_lowercase().contains("mmproj")
}

export_plugin!(LlamaServer);

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_sdk::serde_json::json;

    fn probe(stdout: &str) -> ProbeReport {
        LlamaServer::probe(
            // llama-server prints its version on stderr.
            ProbeInput::new(Some(ProbeRun::exited(
                "/opt/llama/llama-server",
                Some(0),
                "",
                stdout,
            ))),
        )
        .unwrap()
    }

    #[test]
    fn versions_are_read_from_release_and_source_builds() {
        let release = probe("version: 4589 (1d1e6a90)\nbuilt with cc for x86_64-linux-gnu\n");
        assert_eq!(release.version.as_deref(), Some("4589.0.0"));
        assert_eq!(release.program.as_deref(), Some("/opt/llama/llama-server"));
        let source = probe("version: 0.6.0-dev (build 0, commit unknown)\n");
        assert_eq!(source.version.as_deref(), Some("0.6.0-dev"));
        let odd = probe("llama.cpp server\n");
        assert!(odd.available);
        assert_eq!(odd.version, None);
    }

    fn request(path: &str, files: &[&str], accelerator: &str) -> LoadRequest {
        LoadRequest::new("tiny", path, "gguf")
            .with_model_files(files.iter().copied())
            .with_accelerator(accelerator)
            .with_engine(ProbeReport::available(None).with_program("/opt/llama/llama-server"))
            .with_endpoint("127.0.0.1", 8123)
            .with_work_dir("/tmp/w")
    }

    #[test]
    fn a_gguf_file_is_served_with_all_layers_on_a_gpu() {
        let plan =
            LlamaServer::plan_launch(request("/m/tiny.gguf", &["tiny.gguf"], "cuda13")).unwrap();
        assert_eq!(plan.program, "/opt/llama/llama-server");
        assert_eq!(
            plan.args.join(" "),
            "--model /m/tiny.gguf --host 127.0.0.1 --port 8123 --alias tiny --jinja --n-gpu-layers 999"
        );
        assert_eq!(plan.upstream_model.as_deref(), Some("tiny"));
    }

    #[test]
    fn an_embedding_model_is_served_for_embeddings_and_warmed_up_by_one() {
        let plan = LlamaServer::plan_launch(
            request("/m/bge.gguf", &["bge.gguf"], "cpu").with_model_kind("embedding"),
        )
        .unwrap();
        assert_eq!(
            plan.args.join(" "),
            "--model /m/bge.gguf --host 127.0.0.1 --port 8123 --alias tiny --jinja --embeddings --n-gpu-layers 0"
        );
        let warmup = plan.readiness.warmup.unwrap();
        assert_eq!(warmup.path, "/v1/embeddings");
        // A chat model (or an older host, which says nothing) is not.
        let chat = LlamaServer::plan_launch(request("/m/t.gguf", &["t.gguf"], "cpu")).unwrap();
        assert!(!chat.args.iter().any(|a| a == "--embeddings"));
        assert_eq!(chat.readiness.warmup.unwrap().path, "/v1/completions");
    }

    #[test]
    fn a_folder_gives_its_first_shard_and_its_projector() {
        let files = [
            "README.md",
            "mmproj-model-f16.gguf",
            "model-00002-of-00002.gguf",
            "model-00001-of-00002.gguf",
        ];
        let mut req = request("/m/vision", &files, "cpu");
        req.settings.insert("context_length".into(), json!(4096));
        req.settings.insert("threads".into(), json!(2));
        let plan = LlamaServer::plan_launch(req).unwrap();
        assert_eq!(
            plan.args.join(" "),
            "--model /m/vision/model-00001-of-00002.gguf --host 127.0.0.1 --port 8123 --alias tiny --jinja \
             --mmproj /m/vision/mmproj-model-f16.gguf --ctx-size 4096 --n-gpu-layers 0 --threads 2"
        );
    }

    #[test]
    fn a_folder_without_weights_is_refused_with_its_contents() {
        let error =
            LlamaServer::plan_launch(request("/m/empty", &["README.md"], "cpu")).unwrap_err();
        assert_eq!(
            error,
            "the model folder /m/empty holds no .gguf file (it has: README.md)"
        );
    }

    #[test]
    fn max_completion_tokens_becomes_max_tokens() {
        let mapped = LlamaServer::map_request(
            "/v1/chat/completions",
            json!({"model": "tiny", "max_completion_tokens": 7}),
        )
        .unwrap();
        assert_eq!(mapped, Some(json!({"model": "tiny", "max_tokens": 7})));
        let untouched =
            LlamaServer::map_request("/v1/chat/completions", json!({"max_tokens": 3})).unwrap();
        assert_eq!(untouched, None);
    }

    #[test]
    fn a_named_tool_choice_becomes_required_with_that_tool_alone() {
        let tool = |name: &str| json!({"type": "function", "function": {"name": name}});
        let mapped = LlamaServer::map_request(
            "/v1/chat/completions",
            json!({"max_tokens": 8, "tools": [tool("a"), tool("b")],
                   "tool_choice": {"type": "function", "function": {"name": "b"}}}),
        )
        .unwrap();
        assert_eq!(
            mapped,
            Some(json!({"max_tokens": 8, "tools": [tool("b")], "tool_choice": "required"}))
        );
        let required = json!({"max_tokens": 8, "tools": [tool("a")], "tool_choice": "required"});
        assert_eq!(
            LlamaServer::map_request("/v1/chat/completions", required).unwrap(),
            None
        );
    }
}
