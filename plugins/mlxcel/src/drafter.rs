//! Speculative decoding: which kind of drafter a folder holds, whether it
//! pairs with the target model, and the flags that follow.
//!
//! mlxcel's own rule: a drafter whose `config.json` has `model_type`
//! `gemma4_assistant`, `gemma4_unified_assistant` or `qwen3_5_mtp` is a
//! multi-token-prediction (MTP) drafter; anything else (DFlash configs carry
//! no `model_type`) is DFlash. MTP drafters pair with Gemma 4 targets,
//! DFlash with Qwen 3.5 text and VLM targets, and a drafter must share the
//! target's vocabulary. A drafter that does not fit, or an engine version
//! without the kind's capability, falls back to normal decoding, and the
//! session's notes say why; a drafter that is not a local folder is an
//! error, since nothing is fetched from a hub.

use std::path::Path;

use hangar_sdk::wire::LoadRequest;
use serde_json::Value;

use crate::off_reason;

/// The kinds of drafter mlxcel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A small model of the same family (`--model-draft`, `--draft-max`).
    Classic,
    /// Multi-token prediction heads.
    Mtp,
    /// DFlash block drafters.
    Dflash,
}

impl Kind {
    /// The capability the kind needs.
    pub fn capability(self) -> &'static str {
        match self {
            Kind::Classic => "speculative",
            Kind::Mtp => "speculative_mtp",
            Kind::Dflash => "speculative_dflash",
        }
    }

    /// The kind's name on mlxcel's command line.
    fn name(self) -> &'static str {
        match self {
            Kind::Classic => "classic",
            Kind::Mtp => "mtp",
            Kind::Dflash => "dflash",
        }
    }

    /// The kind in a sentence.
    fn described(self) -> &'static str {
        match self {
            Kind::Classic => "a classic drafter",
            Kind::Mtp => "an MTP drafter",
            Kind::Dflash => "a DFlash drafter",
        }
    }
}

const MTP_TYPES: &[&str] = &[
    "gemma4_assistant",
    "gemma4_unified_assistant",
    "qwen3_5_mtp",
];

/// mlxcel's detection rule, from the drafter's `config.json`.
pub fn detect(drafter_config: &Value) -> Kind {
    match drafter_config.get("model_type").and_then(Value::as_str) {
        Some(t) if MTP_TYPES.contains(&t) => Kind::Mtp,
        _ => Kind::Dflash,
    }
}

fn model_type(config: &Value) -> &str {
    config
        .get("model_type")
        .or_else(|| config.get("text_config").and_then(|t| t.get("model_type")))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn vocab_size(config: &Value) -> Option<u64> {
    config
        .get("vocab_size")
        .or_else(|| config.get("text_config").and_then(|t| t.get("vocab_size")))
        .and_then(Value::as_u64)
}

/// Why `kind` cannot draft for `target`, if it cannot.
pub fn mismatch(kind: Kind, target: &Value, drafter: &Value) -> Option<String> {
    let target_type = model_type(target);
    match kind {
        Kind::Mtp if !target_type.starts_with("gemma4") => {
            return Some(format!(
                "an MTP drafter needs a Gemma 4 target, and the model is '{target_type}'"
            ))
        }
        Kind::Dflash if !target_type.starts_with("qwen3_5") => {
            return Some(format!(
                "a DFlash drafter needs a Qwen 3.5 text or VLM target, and the model is '{target_type}'"
            ))
        }
        _ => {}
    }
    match (vocab_size(target), vocab_size(drafter)) {
        (Some(t), Some(d)) if t != d => Some(format!(
            "the drafter's vocabulary ({d} tokens) differs from the model's ({t})"
        )),
        _ => None,
    }
}

fn read_config(folder: &Path) -> Result<Value, String> {
    let path = folder.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
}

/// The drafter flags for `request`, or none with a note saying why the
/// session decodes normally.
pub fn plan(request: &LoadRequest) -> Result<(Vec<String>, Option<String>), String> {
    let Some(draft) = request.settings.get("draft_model").filter(|v| !v.is_null()) else {
        return Ok((vec![], None));
    };
    let draft = draft
        .as_str()
        .ok_or_else(|| format!("setting 'draft_model' must be a folder path, not {draft}"))?;
    let folder = Path::new(draft);
    if !folder.is_absolute() || !folder.join("config.json").is_file() {
        return Err(format!(
            "draft_model '{draft}' is not a local model folder with a config.json; hub names are not fetched: download the drafter and give its absolute path"
        ));
    }
    let has = |cap: &str| request.capabilities.iter().any(|c| c == cap);
    let fallback = |why: String| {
        Ok((
            vec![],
            Some(format!(
                "speculative decoding is off, decoding normally: {why}"
            )),
        ))
    };
    if !has("speculative") {
        return fallback(off_reason(request, "speculative"));
    }
    let drafter = read_config(folder)?;
    let target = read_config(Path::new(&request.model_path))?;
    let kind = match request.settings.get("draft_kind").and_then(Value::as_str) {
        None | Some("auto") => detect(&drafter),
        Some("classic") => Kind::Classic,
        Some("mtp") => Kind::Mtp,
        Some("dflash") => Kind::Dflash,
        Some(other) => {
            return Err(format!(
                "draft_kind must be auto, classic, mtp or dflash, not '{other}'"
            ))
        }
    };
    if !has(kind.capability()) {
        return fallback(format!(
            "the drafter is {}: {}",
            kind.described(),
            off_reason(request, kind.capability())
        ));
    }
    if let Some(why) = mismatch(kind, &target, &drafter) {
        return fallback(why);
    }
    let mut args = vec!["--model-draft".to_string(), draft.to_string()];
    let number = |name: &str| request.settings.get(name).and_then(Value::as_u64);
    match kind {
        Kind::Classic => {
            if let Some(n) = number("draft_tokens") {
                args.extend(["--draft-max".into(), n.to_string()]);
            }
        }
        Kind::Mtp | Kind::Dflash => {
            let block =
                number("draft_block_size").unwrap_or(if kind == Kind::Mtp { 4 } else { 16 });
            args.extend([
                "--draft-kind".into(),
                kind.name().into(),
                "--draft-block-size".into(),
                block.to_string(),
            ]);
        }
    }
    Ok((
        args,
        Some(format!("speculative decoding with {}", kind.described())),
    ))
}
