//! The Hangar plugin: this crate's engine behind the SDK's [`Plugin`] and
//! [`Engine`] traits, exported as the library's root module.
//!
//! The host calls `load_in_process` in the process that will serve (a
//! `hangar worker` by default); the session moves to its own engine thread
//! (see [`Batcher`]), which serves every request the host passes at once
//! with continuous batching, so the description declares as many
//! concurrent `generate` calls as the engine admits sequences.

use std::ops::ControlFlow;
use std::path::Path;

use hangar_sdk::wire::{
    Description, EmbedInput, EmbedOutcome, EmbedRequest, GenerateInput, GenerateOutcome,
    GenerateRequest as WireRequest, LoadRequest, ProbeInput, ProbeReport, RerankOutcome,
    RerankRequest, SpeculationUsage,
};
use hangar_sdk::{export_plugin, Engine, Plugin};
use serde_json::Value;

use crate::{
    model_kind, Answer, BatchOptions, Batcher, ChatMessage, ChatOptions, Content, ContentPart,
    DeviceKind, DraftLoad, Drafter, Embedder, FinishReason, GenerateRequest, LoadOptions,
    ModelKind, Prompt, SamplingParams, Session, SpecPrefill, Speculation, Tokenizer, MAX_K,
};

struct NativeMlx;

impl Plugin for NativeMlx {
    fn describe() -> Description {
        hangar_sdk::describe!("native-mlx", formats: ["mlx"], aliases: {"safetensors" => "mlx"}, capabilities: ["tool_calls", "structured_output", "embeddings", "rerank", "speculative", "speculative_mtp", "vision"])
            .with_concurrent_generates(BatchOptions::default().max_sequences as u32)
    }

    fn probe(_input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(match crate::probe() {
            Ok(mlx) => ProbeReport::available(Some(mlx.version.clone()))
                .with_device(match mlx.device {
                    DeviceKind::Cpu => "cpu",
                    DeviceKind::Gpu => "gpu",
                })
                .with_detail(format!("MLX {} on the {:?}", mlx.version, mlx.device).to_lowercase()),
            Err(e) => ProbeReport::unavailable(format!("the MLX library does not answer: {e}")),
        })
    }

    fn load_in_process(request: LoadRequest) -> Result<Box<dyn Engine>, String> {
        let options = batch_options(&request.plugin_settings, request.cache_dir.as_deref())?;
        let placement = load_options(&request.plugin_settings)?;
        let dir = Path::new(&request.model_path);
        let named = |e: crate::Error| format!("model '{}': {e}", request.model_id);
        let kind = model_kind(dir).map_err(named)?;
        if kind != ModelKind::Chat {
            let embedder = Embedder::load(dir, kind, &placement).map_err(named)?;
            return Ok(Box::new(Loaded::Embed {
                id: request.model_id,
                embedder: Box::new(std::sync::Mutex::new(embedder)),
            }));
        }
        let (mut speculate, mut draft) = speculate_settings(&request.settings)?;
        let spec_prefill = spec_prefill_settings(&request.settings)?;
        if spec_prefill.is_some() && draft.is_none() {
            // The scorer loads even where it proposes nothing.
            draft = Some(named_drafter(&request.settings).ok_or(
                "setting 'spec_prefill' of native-mlx needs a scorer: set 'draft_model' (a small MLX model of the same tokenizer) or 'draft_layers' (the model's own first layers)",
            )?);
        }
        let session = Session::load_with(dir, &placement)
            .map_err(|e| format!("model '{}': {e}", request.model_id))?;
        let mut notes = Vec::new();
        // A vision tower that does not load leaves the model serving text.
        notes.extend(session.vision_problem());
        let scores = spec_prefill.is_some();
        if let Some(note) = resolve_mtp(
            &request.settings,
            &mut speculate,
            &mut draft,
            scores,
            &session,
        ) {
            notes.push(note);
        }
        let drafter = match draft {
            None => None,
            Some(DraftSource::Layers(layers)) => Some(
                Drafter::first_layers(&session, layers)
                    .map_err(|e| format!("model '{}': {e}", request.model_id))?,
            ),
            Some(DraftSource::Folder(dir)) => match Drafter::load(Path::new(&dir), &session)
                .map_err(|e| format!("model '{}': draft model {dir}: {e}", request.model_id))?
            {
                DraftLoad::Fits(drafter) => Some(*drafter),
                DraftLoad::Unfit(why) => {
                    // The model serves with plain decoding; the host shows
                    // why with the session and as an event.
                    notes.push(format!(
                        "the draft model {dir} is not used, so requests decode without it: {why}"
                    ));
                    if spec_prefill.is_some() {
                        notes.push(
                            "spec_prefill is off: its scorer, the draft model, is not used".into(),
                        );
                    }
                    speculate.draft_model = false;
                    None
                }
            },
        };
        let options = BatchOptions {
            spec_prefill,
            ..options
        };
        Ok(Box::new(Loaded::Chat {
            id: request.model_id,
            tokenizer: Box::new(session.tokenizer().clone()),
            speculate,
            batcher: Batcher::start_with_drafter(session, options, drafter),
            notes,
        }))
    }
}

export_plugin!(NativeMlx);

/// The scheduling settings of `[plugins.native-mlx]`, defaults for those
/// not given.
fn batch_options(
    settings: &std::collections::BTreeMap<String, Value>,
    cache_dir: Option<&str>,
) -> Result<BatchOptions, String> {
    let mut options = BatchOptions::default();
    let number = |name: &str, min: u64| -> Result<Option<u64>, String> {
        match settings.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(format!(
                    "setting '{name}' of native-mlx must be an integer >= {min}, got {v}"
                )),
            },
        }
    };
    if let Some(n) = number("max_sequences", 1)? {
        options.max_sequences = n as usize;
    }
    if let Some(n) = number("step_tokens", 1)? {
        options.step_tokens = n as usize;
    }
    options.paged_attention = flag(settings, "paged_attention")?;
    if let Some(n) = number("merge_padding", 0)? {
        options.merge_padding = Some(n as usize);
    }
    if let Some(n) = number("prefix_cache_mb", 0)? {
        options.prefix_cache_bytes = (n as usize) << 20;
    }
    if let Some(n) = number("prefix_cache_disk_mb", 0)? {
        options.prefix_cache_disk_bytes = n << 20;
    }
    options.prefix_cache_dir = match settings.get("prefix_cache_dir") {
        Some(Value::String(dir)) => Some(dir.into()),
        Some(other) => {
            return Err(format!(
                "setting 'prefix_cache_dir' of native-mlx must be a folder path, got {other}"
            ))
        }
        // The host's cache folder for this plugin outlives sessions and
        // restarts; a host older than plugin-api 1.1 gives none, and the
        // disk tier stays off unless the setting names a folder.
        None => cache_dir.map(|dir| Path::new(dir).join("prefix")),
    };
    Ok(options)
}

/// How `[plugins.native-mlx]` has models placed: `moe_kernel` (default
/// true; ignored off CUDA) puts 4-bit mixture-of-experts products of two
/// or more rows per expert on Hangar's own kernel
/// (`LoadOptions::custom_gather_qmv`).
fn load_options(
    settings: &std::collections::BTreeMap<String, Value>,
) -> Result<LoadOptions, String> {
    let mut options = LoadOptions::default();
    if let Some(on) = flag(settings, "moe_kernel")? {
        options.custom_gather_qmv = on;
    }
    Ok(options)
}

/// A true-or-false setting, `None` where it is not given.
fn flag(
    settings: &std::collections::BTreeMap<String, Value>,
    name: &str,
) -> Result<Option<bool>, String> {
    match settings.get(name) {
        None => Ok(None),
        Some(Value::Bool(on)) => Ok(Some(*on)),
        Some(other) => Err(format!(
            "setting '{name}' of native-mlx must be true or false, got {other}"
        )),
    }
}

/// Where a model's drafter comes from.
#[derive(Debug, Clone, PartialEq)]
enum DraftSource {
    /// Another model's folder (`draft_model`).
    Folder(String),
    /// The model's own first layers (`draft_layers`).
    Layers(usize),
}

/// How the model's requests speculate, from the settings `draft_kind`
/// (`off`, `prompt_lookup`, `draft_model`, `draft_layers`, `mtp` (the
/// model's own multi-token-prediction layers) or `auto` (those where the
/// checkpoint has them, else the drafter named); a request's prediction
/// proposes either way), `draft_model` (a draft model's folder,
/// which makes `draft_model` the default kind), `draft_layers` (the
/// model's own first layers as its drafter, the default kind when set)
/// and `draft_tokens` (the most proposed per pass; unset, adapted to the
/// acceptance rate); and where the drafter comes from, when there is one.
/// Off by default: a speculating sequence reads each step before building
/// the next, which costs the overlap of host and device work where
/// nothing is proposed.
fn speculate_settings(
    settings: &std::collections::BTreeMap<String, Value>,
) -> Result<(Speculation, Option<DraftSource>), String> {
    let folder = match settings.get("draft_model") {
        None | Some(Value::Null) => None,
        Some(Value::String(dir)) if !dir.is_empty() => Some(dir.clone()),
        Some(other) => {
            return Err(format!(
                "setting 'draft_model' of native-mlx must be the path of an MLX model folder, got {other}"
            ))
        }
    };
    let layers = match settings.get("draft_layers") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n @ 1..) => Some(n as usize),
            _ => {
                return Err(format!(
                    "setting 'draft_layers' of native-mlx must be a positive integer (how many of the model's first layers draft), got {v}"
                ))
            }
        },
    };
    if folder.is_some() && layers.is_some() {
        return Err(
            "settings 'draft_model' and 'draft_layers' of native-mlx name two drafters; set one"
                .into(),
        );
    }
    let kind = match settings.get("draft_kind") {
        None | Some(Value::Null) if folder.is_some() => "draft_model",
        None | Some(Value::Null) if layers.is_some() => "draft_layers",
        None | Some(Value::Null) => "off",
        Some(Value::String(kind))
            if matches!(
                kind.as_str(),
                "off" | "prompt_lookup" | "draft_model" | "draft_layers" | "mtp" | "auto"
            ) =>
        {
            kind.as_str()
        }
        Some(other) => {
            return Err(format!(
            "setting 'draft_kind' of native-mlx must be \"off\", \"prompt_lookup\", \"draft_model\", \"draft_layers\", \"mtp\" or \"auto\", got {other}"
        ))
        }
    };
    let source = match kind {
        "draft_model" => Some(DraftSource::Folder(folder.ok_or(
            "setting 'draft_kind' of native-mlx is \"draft_model\" but no 'draft_model' names the draft model's folder",
        )?)),
        "draft_layers" => Some(DraftSource::Layers(layers.ok_or(
            "setting 'draft_kind' of native-mlx is \"draft_layers\" but no 'draft_layers' says how many of the model's layers draft",
        )?)),
        // The drafter named, if any, for a model without MTP layers (see
        // `resolve_mtp`).
        "auto" => folder
            .map(DraftSource::Folder)
            .or(layers.map(DraftSource::Layers)),
        // An explicit other kind leaves the drafter unloaded.
        _ => None,
    };
    let k = match settings.get("draft_tokens") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(k @ 1..) if k as usize <= MAX_K => k as usize,
            _ => {
                return Err(format!(
                    "setting 'draft_tokens' of native-mlx must be an integer from 1 to {MAX_K}, got {v}"
                ))
            }
        },
    };
    Ok((
        Speculation {
            prompt_lookup: kind == "prompt_lookup",
            prediction: None,
            draft_model: source.is_some(),
            // Decided once the model is loaded (`resolve_mtp`).
            mtp: matches!(kind, "mtp" | "auto"),
            k,
            accept_all: false,
        },
        source,
    ))
}

/// The MTP layer's part in `speculate`, once the model is loaded: with
/// `draft_kind = "auto"`, the model's MTP layers propose where its
/// checkpoint has them (the named drafter then proposes nothing, and is
/// loaded only where it scores for SpecPrefill, `scores`), else the
/// drafter named, else nothing; with `"mtp"`, a model without them
/// decodes plainly, and the returned note says why.
fn resolve_mtp(
    settings: &std::collections::BTreeMap<String, Value>,
    speculate: &mut Speculation,
    draft: &mut Option<DraftSource>,
    scores: bool,
    session: &Session,
) -> Option<String> {
    if !speculate.mtp {
        return None;
    }
    let model = session.model();
    let auto = settings.get("draft_kind").and_then(Value::as_str) == Some("auto");
    if model.mtp_layers() > 0 {
        if auto {
            speculate.draft_model = false;
            if !scores {
                *draft = None;
            }
        }
        return None;
    }
    speculate.mtp = false;
    if auto {
        return None;
    }
    let why = model.why_no_mtp().unwrap_or_default();
    Some(format!(
        "draft_kind \"mtp\" is not used, so requests decode without speculation: {why}"
    ))
}

/// SpecPrefill, from the settings `spec_prefill` (on or off, the default),
/// `spec_prefill_min_tokens` (prompts with fewer uncached tokens are
/// prefilled whole) and `spec_prefill_keep` (the share prefilled); `None`
/// when off.
fn spec_prefill_settings(
    settings: &std::collections::BTreeMap<String, Value>,
) -> Result<Option<SpecPrefill>, String> {
    match settings.get("spec_prefill") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => {}
        Some(other) => {
            return Err(format!(
                "setting 'spec_prefill' of native-mlx must be true or false, got {other}"
            ))
        }
    }
    let mut options = SpecPrefill::default();
    match settings.get("spec_prefill_min_tokens") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_u64() {
            Some(n @ 1..) => options.min_tokens = n as usize,
            _ => {
                return Err(format!(
                    "setting 'spec_prefill_min_tokens' of native-mlx must be a positive integer, got {v}"
                ))
            }
        },
    }
    match settings.get("spec_prefill_keep") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_f64() {
            Some(keep) if keep > 0.0 && keep <= 1.0 => options.keep = keep as f32,
            _ => {
                return Err(format!(
                    "setting 'spec_prefill_keep' of native-mlx must be a number above 0 and at most 1 (the share of the prompt prefilled), got {v}"
                ))
            }
        },
    }
    Ok(Some(options))
}

/// The drafter the settings name (`draft_model` or `draft_layers`, as
/// [`speculate_settings`] checked them), whatever `draft_kind` says.
fn named_drafter(settings: &std::collections::BTreeMap<String, Value>) -> Option<DraftSource> {
    if let Some(Value::String(dir)) = settings.get("draft_model") {
        return Some(DraftSource::Folder(dir.clone()));
    }
    let layers = settings.get("draft_layers")?.as_u64()?;
    Some(DraftSource::Layers(layers as usize))
}

/// A loaded model: a chat model behind its batcher, or an embedder or
/// reranker, which computes each request in the calling thread, one at a
/// time.
enum Loaded {
    Chat {
        id: String,
        batcher: Batcher,
        /// For predicted outputs, tokenised per request.
        tokenizer: Box<Tokenizer>,
        /// The model's speculation settings.
        speculate: Speculation,
        /// What the load decided that the operator should know.
        notes: Vec<String>,
    },
    Embed {
        id: String,
        embedder: Box<std::sync::Mutex<Embedder>>,
    },
}

impl Loaded {
    fn embedder(&self) -> Result<std::sync::MutexGuard<'_, Embedder>, String> {
        match self {
            Loaded::Embed { embedder, .. } => embedder
                .lock()
                .map_err(|_| "the embedding engine failed on an earlier request; reload the model".into()),
            Loaded::Chat { id, .. } => Err(format!(
                "model '{id}' is a chat model; it generates text and computes no embeddings or rerank scores"
            )),
        }
    }
}

impl Engine for Loaded {
    fn notes(&self) -> Vec<String> {
        match self {
            Loaded::Chat { notes, .. } => notes.clone(),
            Loaded::Embed { .. } => Vec::new(),
        }
    }

    fn embed(&self, request: EmbedRequest) -> Result<EmbedOutcome, String> {
        let embedder = self.embedder()?;
        let inputs = request
            .inputs
            .into_iter()
            .map(|input| match input {
                EmbedInput::Text(text) => embedder.encode(&text).map_err(|e| e.to_string()),
                EmbedInput::Tokens(ids) => Ok(ids),
                _ => Err("native-mlx does not embed this kind of input".into()),
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(match embedder.embed(&inputs).map_err(|e| e.to_string())? {
            Answer::Done { results, tokens } => EmbedOutcome::new(
                results,
                tokens as u32,
                embedder.pooling().id(),
                embedder.normalized(),
            ),
            Answer::Refused { input, message } => EmbedOutcome::refused(input as u32, message),
        })
    }

    fn rerank(&self, request: RerankRequest) -> Result<RerankOutcome, String> {
        let embedder = self.embedder()?;
        Ok(
            match embedder
                .rerank(&request.query, &request.documents)
                .map_err(|e| e.to_string())?
            {
                Answer::Done { results, tokens } => RerankOutcome::new(results, tokens as u32),
                Answer::Refused { input, message } => RerankOutcome::refused(input as u32, message),
            },
        )
    }

    fn generate(
        &self,
        request: WireRequest,
        emit: &mut dyn FnMut(&str, u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutcome, String> {
        let (batcher, tokenizer, speculate) = match self {
            Loaded::Chat {
                batcher,
                tokenizer,
                speculate,
                ..
            } => (batcher, tokenizer, speculate),
            Loaded::Embed { id, embedder } => {
                let what = match embedder.lock().map(|e| e.kind()) {
                    Ok(ModelKind::Reranker) => "a reranking model",
                    _ => "an embedding model",
                };
                return Err(format!("model '{id}' is {what}; it generates no text"));
            }
        };
        let prompt = match request.input {
            GenerateInput::Completion { prompt, .. } => Prompt::Text(prompt),
            GenerateInput::Chat { messages, .. } => Prompt::Chat {
                messages: messages.iter().map(message).collect::<Result<_, _>>()?,
                options: ChatOptions {
                    add_generation_prompt: true,
                    // The template renders them; the host parses the calls.
                    tools: (!request.tools.is_empty()).then(|| Value::Array(request.tools)),
                    ..ChatOptions::default()
                },
            },
            // An input a later plugin-api adds: this engine does not serve it.
            _ => return Err("native-mlx does not serve this kind of input".into()),
        };
        let mut sampling = SamplingParams::greedy();
        sampling.temperature = request.temperature.unwrap_or(0.0);
        sampling.top_p = request.top_p.unwrap_or(1.0);
        sampling.top_k = request.top_k.unwrap_or(0) as usize;
        sampling.min_p = request.min_p.unwrap_or(0.0);
        sampling.seed = request.seed;
        let mut generate = GenerateRequest::new(prompt, request.max_tokens.unwrap_or(512) as usize);
        generate.sampling = sampling;
        generate.stop = request.stop;
        generate.grammar = request.grammar;
        generate.speculation = speculate.clone();
        if let Some(text) = request.prediction.as_deref().filter(|t| !t.is_empty()) {
            let tokens = tokenizer.encode(text, false).map_err(|e| e.to_string())?;
            generate.speculation.prediction = Some(tokens);
        }
        let done = batcher
            .generate(generate, |event| {
                emit(event.text, event.token.unwrap_or(u32::MAX))
            })
            .map_err(engine_error)?;
        let finish_reason = match done.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        };
        let outcome = GenerateOutcome::new(
            finish_reason,
            done.usage.prompt_tokens as u32,
            done.usage.completion_tokens as u32,
        )
        .with_cached_tokens(done.usage.cached_prompt_tokens as u32);
        let spec = done.speculation;
        if spec.verifications == 0 {
            return Ok(outcome);
        }
        let mut usage = SpeculationUsage::new(
            spec.verifications as u32,
            spec.proposed as u32,
            spec.accepted as u32,
        )
        .with_prediction(
            spec.accepted_prediction as u32,
            spec.rejected_prediction as u32,
        );
        if let Some(seconds) = spec.time_saved {
            usage = usage.with_time_saved((seconds * 1e3).round() as i64);
        }
        Ok(outcome.with_speculation(usage))
    }
}

/// An OpenAI chat message as the chat template sees it: text parts of a
/// multi-part content are joined, unless it has images (`image_url` parts
/// of `data:` URLs, as the host sends them to an engine with the `vision`
/// capability): then the template gets the parts, as transformers passes
/// them (`{"type": "text", "text": …}`, `{"type": "image"}`).
fn message(value: &Value) -> Result<ChatMessage, String> {
    let role = value
        .get("role")
        .and_then(Value::as_str)
        .ok_or("every message needs a 'role'")?;
    let content = match value.get("content") {
        None | Some(Value::Null) => Content::Text(String::new()),
        Some(Value::String(s)) => Content::Text(s.clone()),
        Some(Value::Array(parts)) => {
            let parts = parts
                .iter()
                .map(|p| match p.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(ContentPart::text(
                        p.get("text").and_then(Value::as_str).unwrap_or_default(),
                    )),
                    Some("image_url") => image_part(p),
                    other => Err(format!(
                        "native-mlx takes text and image_url parts, not '{}' parts",
                        other.unwrap_or("untyped")
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if parts.iter().any(|p| matches!(p, ContentPart::Image(_))) {
                Content::Parts(parts)
            } else {
                let texts = parts.iter().map(|p| match p {
                    ContentPart::Text { text } => text.as_str(),
                    ContentPart::Image(_) => "",
                });
                Content::Text(texts.collect())
            }
        }
        Some(other) => return Err(format!("message content must be text, not {other}")),
    };
    let mut m = ChatMessage::with_parts(role, content);
    if let Value::Object(fields) = value {
        m.extra = fields
            .iter()
            .filter(|(k, _)| *k != "role" && *k != "content")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    Ok(m)
}

/// An OpenAI `image_url` part's image: the bytes of its `data:` URL
/// (`data:image/png;base64,…`; the host takes no other).
fn image_part(part: &Value) -> Result<ContentPart, String> {
    use base64::Engine as _;
    let url = part
        .get("image_url")
        .and_then(|i| i.get("url"))
        .and_then(Value::as_str)
        .ok_or(
            "invalid request: an image_url part needs 'image_url.url', a data: URL of the image",
        )?;
    let data = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .map(|(_, data)| data)
        .ok_or("invalid request: native-mlx takes images as data: URLs (data:image/png;base64,...) only")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("invalid request: an image_url's data is not valid base64: {e}"))?;
    Ok(ContentPart::image(bytes))
}

/// The words of an engine error for the host: a request the model cannot
/// serve (a bad image, images to a model without vision) is the client's
/// (the host answers 400 for `invalid request: …`).
fn engine_error(e: crate::Error) -> String {
    match e {
        crate::Error::Image(_) => format!("invalid request: {e}"),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn image_url_parts_become_images_and_text_parts_stay_text() {
        let m = message(&json!({"role": "user", "content": [
            {"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}))
        .unwrap();
        assert_eq!(m.content, Content::Text("Hi there".into()));
        let m = message(&json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AQID"}},
            {"type": "text", "text": "What is it?"}]}))
        .unwrap();
        assert_eq!(
            m.content,
            Content::Parts(vec![
                ContentPart::image(vec![1u8, 2, 3]),
                ContentPart::text("What is it?")
            ])
        );
        let bad = |url: &str| {
            message(&json!({"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}]}))
            .unwrap_err()
        };
        assert!(
            bad("https://x/y.png").contains("data: URLs"),
            "{}",
            bad("https://x")
        );
        assert!(bad("data:image/png;base64,%%").starts_with("invalid request: "));
    }

    #[test]
    fn scheduling_settings_are_read_and_bad_values_named() {
        let options = |v: Value| batch_options(&serde_json::from_value(v).unwrap(), None);
        let o = options(json!({"merge_padding": 0, "paged_attention": true})).unwrap();
        assert_eq!((o.merge_padding, o.paged_attention), (Some(0), Some(true)));
        let o = options(json!({})).unwrap();
        assert_eq!((o.merge_padding, o.paged_attention), (None, None));
        let e = options(json!({"paged_attention": "yes"})).unwrap_err();
        assert!(e.contains("'paged_attention'"), "{e}");
        let e = options(json!({"merge_padding": -1})).unwrap_err();
        assert!(e.contains("'merge_padding'"), "{e}");
        let placement = |v: Value| load_options(&serde_json::from_value(v).unwrap());
        assert!(placement(json!({})).unwrap().custom_gather_qmv);
        assert!(
            !placement(json!({"moe_kernel": false}))
                .unwrap()
                .custom_gather_qmv
        );
        let e = placement(json!({"moe_kernel": 0})).unwrap_err();
        assert!(e.contains("'moe_kernel'"), "{e}");
    }

    /// The speculation settings as a model's settings give them, or the
    /// refusal's words.
    fn check(settings: Value) -> Result<(Speculation, Option<DraftSource>), String> {
        speculate_settings(&serde_json::from_value(settings).unwrap())
    }

    #[test]
    fn a_drafter_setting_chooses_its_kind_and_clashes_are_refused() {
        let (spec, source) = check(json!({})).unwrap();
        assert!(!spec.is_on());
        assert_eq!(source, None);
        let (spec, source) = check(json!({"draft_model": "/m/draft"})).unwrap();
        assert!(spec.draft_model);
        assert_eq!(source, Some(DraftSource::Folder("/m/draft".into())));
        let (spec, source) = check(json!({"draft_layers": 4, "draft_tokens": 3})).unwrap();
        assert!(spec.draft_model && spec.k == 3);
        assert_eq!(source, Some(DraftSource::Layers(4)));
        // An explicit other kind leaves the drafter unloaded.
        let (spec, source) =
            check(json!({"draft_model": "/m/draft", "draft_kind": "prompt_lookup"})).unwrap();
        assert!(spec.prompt_lookup && !spec.draft_model);
        assert_eq!(source, None);
        // The model's MTP layers: explicitly, or `auto` with the named
        // drafter in reserve (`resolve_mtp` decides with the model).
        let (spec, source) = check(json!({"draft_kind": "mtp"})).unwrap();
        assert!(spec.mtp && !spec.draft_model && spec.is_on());
        assert_eq!(source, None);
        let (spec, source) = check(json!({"draft_kind": "auto", "draft_layers": 2})).unwrap();
        assert!(spec.mtp && spec.draft_model);
        assert_eq!(source, Some(DraftSource::Layers(2)));
        let (spec, _) = check(json!({"draft_model": "/m/draft"})).unwrap();
        assert!(!spec.mtp);
        for (settings, words) in [
            (
                json!({"draft_model": "/a", "draft_layers": 2}),
                "name two drafters",
            ),
            (
                json!({"draft_kind": "draft_model"}),
                "no 'draft_model' names",
            ),
            (
                json!({"draft_kind": "draft_layers"}),
                "no 'draft_layers' says",
            ),
            (
                json!({"draft_layers": 0}),
                "'draft_layers' of native-mlx must be a positive integer",
            ),
            (
                json!({"draft_model": 3}),
                "'draft_model' of native-mlx must be the path",
            ),
            (
                json!({"draft_kind": "medusa"}),
                "'draft_kind' of native-mlx must be",
            ),
            (json!({"draft_tokens": 9}), "from 1 to 8, got 9"),
        ] {
            let error = check(settings.clone()).unwrap_err();
            assert!(error.contains(words), "{settings}: {error}");
        }
    }

    /// The manifest lists every family the engine loads, so that
    /// resolution sends them here (and nothing it cannot load).
    #[test]
    fn the_manifest_lists_the_model_types_the_engine_loads() {
        let manifest = include_str!("../plugin.toml");
        let list = manifest
            .split("\nmodel_types = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("plugin.toml has model_types");
        let listed: Vec<&str> = list
            .split(',')
            .map(|t| t.trim().trim_matches('"'))
            .filter(|t| !t.is_empty())
            .collect();
        let mut engine: Vec<&str> = crate::SUPPORTED_MODEL_TYPES.to_vec();
        engine.extend(["bert", "roberta", "xlm-roberta"]);
        assert_eq!(listed, engine);
    }

    /// The manifest parses and validates as the host reads it, and
    /// declares the capabilities the artifact's description names
    /// (`speculative_mtp` among them, which `draft_kind`'s `mtp` and
    /// `auto` need).
    #[test]
    fn the_manifest_validates_and_declares_the_described_capabilities() {
        let manifest =
            hangar_sdk::api::manifest::Manifest::parse(include_str!("../plugin.toml")).unwrap();
        let declared: Vec<&String> = manifest.capabilities.keys().collect();
        let mut described = NativeMlx::describe().capabilities;
        described.sort();
        assert_eq!(declared, described.iter().collect::<Vec<_>>());
        assert!(described.iter().any(|c| c == "speculative_mtp"));
    }

    #[test]
    fn spec_prefill_settings_are_checked_and_find_their_scorer() {
        let of = |v: Value| spec_prefill_settings(&serde_json::from_value(v).unwrap());
        assert_eq!(of(json!({})).unwrap(), None);
        assert_eq!(of(json!({"spec_prefill": false})).unwrap(), None);
        let on = of(
            json!({"spec_prefill": true, "spec_prefill_keep": 0.5, "spec_prefill_min_tokens": 100}),
        )
        .unwrap()
        .unwrap();
        assert_eq!((on.keep, on.min_tokens), (0.5, 100));
        for (settings, words) in [
            (
                json!({"spec_prefill": "yes"}),
                "'spec_prefill' of native-mlx must be true or false",
            ),
            (
                json!({"spec_prefill": true, "spec_prefill_keep": 0}),
                "above 0 and at most 1",
            ),
            (
                json!({"spec_prefill": true, "spec_prefill_keep": 1.5}),
                "above 0 and at most 1",
            ),
            (
                json!({"spec_prefill": true, "spec_prefill_min_tokens": 0}),
                "positive integer",
            ),
        ] {
            let error = of(settings.clone()).unwrap_err();
            assert!(error.contains(words), "{settings}: {error}");
        }
        // A scorer named with speculation off is still found.
        let settings = json!({"draft_layers": 3, "draft_kind": "off"});
        assert_eq!(check(settings.clone()).unwrap().1, None);
        let named = named_drafter(&serde_json::from_value(settings).unwrap());
        assert_eq!(named, Some(DraftSource::Layers(3)));
    }
}
