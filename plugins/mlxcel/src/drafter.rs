//! Speculative decoding: which kind of drafter a folder holds, whether it
//! pairs with the target model, and the flags that follow.
//!
//! mlxcel's own rule (0.0.27 on): a drafter whose `config.json` has
//! `model_type` `gemma4_assistant`, `gemma4_unified_assistant` or
//! `qwen3_5_mtp` is a multi-token-prediction (MTP) drafter; anything else
//! (DFlash configs carry no `model_type`) is loaded as DFlash. There is no
//! "classic" choice on those builds: a plain small model given as the
//! drafter is DFlash to them. Builds before 0.0.27 have no `--draft-kind`
//! and run any drafter as a plain draft model (`--model-draft`,
//! `--draft-max`); the plan does that there, and only there.
//!
//! `draft_kind = "auto"` (the default) passes no `--draft-kind` and leaves
//! the choice to mlxcel, and no `--draft-block-size` unless it is set:
//! newer builds size the block from the drafter checkpoint itself or a
//! measured default, which an explicit value would override.
//!
//! MTP drafters pair with Gemma 4 targets, DFlash drafters with Qwen 3.5
//! text and VLM targets, and both must share the target's vocabulary size.
//! (A plain draft model on an old build is not checked: small and large
//! models of one family often pad their embeddings to different
//! `vocab_size`s while sharing a tokenizer, as Qwen2.5 0.5B and 7B do.)
//!
//! A drafter that does not fit, or an engine version without the kind's
//! capability, falls back to normal decoding, with no draft flag at all and
//! a note (shown by `GET /api/sessions`) saying exactly why. A drafter
//! that is not a local folder is an error: mlxcel-server would download a
//! hub name, and Hangar never fetches anything.

use std::path::Path;

use hangar_sdk::wire::{settings as names, LoadRequest};
use serde_json::Value;

use crate::{has, invalid, local_path, off_reason, read_config, setting};

/// `draft_kind`: `auto`, `mtp` or `dflash`.
pub const DRAFT_KIND: &str = "draft_kind";
/// `draft_block_size`: block length of MTP and DFlash drafters.
pub const DRAFT_BLOCK_SIZE: &str = "draft_block_size";

/// The kinds of drafter mlxcel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain small model of the same family (`--model-draft`,
    /// `--draft-max`): what builds before 0.0.27 make of any drafter.
    Plain,
    /// Multi-token prediction heads (`--draft-kind mtp`).
    Mtp,
    /// DFlash block drafters (`--draft-kind dflash`).
    Dflash,
}

impl Kind {
    /// The capability the kind needs.
    pub fn capability(self) -> &'static str {
        match self {
            Kind::Plain => "speculative",
            Kind::Mtp => "speculative_mtp",
            Kind::Dflash => "speculative_dflash",
        }
    }

    /// The kind in a sentence.
    fn described(self) -> &'static str {
        match self {
            Kind::Plain => "a plain draft model",
            Kind::Mtp => "an MTP drafter",
            Kind::Dflash => "a DFlash drafter",
        }
    }

    /// The `--draft-kind` value; a plain draft model takes none.
    fn flag(self) -> Option<&'static str> {
        match self {
            Kind::Plain => None,
            Kind::Mtp => Some("mtp"),
            Kind::Dflash => Some("dflash"),
        }
    }
}

/// Drafter `model_type`s that mlxcel runs as MTP.
const MTP_TYPES: &[&str] = &[
    "gemma4_assistant",
    "gemma4_unified_assistant",
    "qwen3_5_mtp",
];

/// mlxcel's detection rule, from the drafter's `config.json`, with the
/// evidence in words.
pub fn detect(drafter_config: &Value) -> (Kind, String) {
    match drafter_config.get("model_type").and_then(Value::as_str) {
        Some(t) if MTP_TYPES.contains(&t) => (Kind::Mtp, format!("its model_type is '{t}'")),
        Some(t) => (
            Kind::Dflash,
            format!("its model_type '{t}' is not an MTP type, which mlxcel reads as DFlash"),
        ),
        None => (
            Kind::Dflash,
            "its config.json has no model_type, which mlxcel reads as DFlash".into(),
        ),
    }
}

/// A field of the config, or of its `text_config` (VLMs nest the language
/// model's there).
fn field<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    config
        .get(key)
        .or_else(|| config.get("text_config").and_then(|t| t.get(key)))
}

fn model_type(config: &Value) -> &str {
    field(config, "model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn vocab_size(config: &Value) -> Option<u64> {
    field(config, "vocab_size").and_then(Value::as_u64)
}

/// Why `kind` cannot draft for `target`, if it cannot. Only MTP and DFlash
/// drafters are checked (see the module docs).
pub fn mismatch(kind: Kind, target: &Value, drafter: &Value) -> Option<String> {
    let target_type = model_type(target);
    let family = match kind {
        Kind::Plain => return None,
        Kind::Mtp => ("gemma4", "a Gemma 4 target (model_type gemma4*)"),
        Kind::Dflash => (
            "qwen3_5",
            "a Qwen 3.5 text or VLM target (model_type qwen3_5*)",
        ),
    };
    if !target_type.starts_with(family.0) {
        return Some(format!(
            "{} needs {}, and the model is '{target_type}'",
            kind.described(),
            family.1
        ));
    }
    match (vocab_size(target), vocab_size(drafter)) {
        (Some(t), Some(d)) if t != d => Some(format!(
            "the drafter's vocabulary ({d} tokens) differs from the model's ({t})"
        )),
        _ => None,
    }
}

/// What speculative decoding adds to the plan.
#[derive(Debug, Default)]
pub struct Planned {
    /// Draft flags; empty when decoding normally.
    pub args: Vec<String>,
    /// What was decided, and why.
    pub notes: Vec<String>,
}

/// The drafter flags for `request` (whose model folder is `target_dir`),
/// or none with a note saying why the session decodes normally.
pub fn plan(request: &LoadRequest, target_dir: &Path) -> Result<Planned, String> {
    let mut planned = Planned::default();
    let related = [DRAFT_KIND, names::DRAFT_TOKENS, DRAFT_BLOCK_SIZE];
    let Some(draft) = setting(request, names::DRAFT_MODEL) else {
        for name in related.iter().filter(|n| setting(request, n).is_some()) {
            planned.notes.push(format!(
                "setting '{name}' was not applied: it does nothing without draft_model"
            ));
        }
        return Ok(planned);
    };
    if !has(request, "speculative") {
        planned.notes.push(format!(
            "speculative decoding is off, decoding normally: {}",
            off_reason(request, "speculative")
        ));
        return Ok(planned);
    }
    let path = draft.as_str().ok_or_else(|| {
        invalid(
            request,
            names::DRAFT_MODEL,
            draft,
            "it must be the path of a local drafter folder (a string)",
        )
    })?;
    let folder = local_path(path);
    if !folder.join("config.json").is_file() {
        return Err(invalid(
            request,
            names::DRAFT_MODEL,
            draft,
            &format!(
                "'{}' is not a local model folder with a config.json; hub names are not fetched: download the drafter and give its folder",
                folder.display()
            ),
        ));
    }
    let shown = folder.display().to_string();
    let drafter = read_config(&folder)?;
    let chosen = setting(request, DRAFT_KIND);
    let auto = matches!(chosen.map(Value::as_str), None | Some(Some("auto")));
    let (mut kind, mut evidence) = match chosen.map(|v| (v, v.as_str())) {
        None | Some((_, Some("auto"))) => detect(&drafter),
        Some((_, Some("mtp"))) => (Kind::Mtp, "draft_kind = \"mtp\"".into()),
        Some((_, Some("dflash"))) => (Kind::Dflash, "draft_kind = \"dflash\"".into()),
        Some((value, _)) => {
            return Err(invalid(
                request,
                DRAFT_KIND,
                value,
                "it must be auto, mtp or dflash (mlxcel has no classic drafter kind: it loads a plain small model as DFlash)",
            ))
        }
    };
    // Before 0.0.27 mlxcel has neither kind and drafts with any drafter as
    // a plain draft model.
    if auto && kind == Kind::Dflash && !has(request, Kind::Dflash.capability()) {
        kind = Kind::Plain;
        evidence = format!("{evidence}; builds before 0.0.27 run it as a plain draft model");
    }
    let fallback = |planned: &mut Planned, why: String| {
        planned.notes.push(format!(
            "speculative decoding is off, decoding normally: draft_model '{shown}' is {} ({evidence}), and {why}",
            kind.described()
        ));
    };
    if !has(request, kind.capability()) {
        fallback(&mut planned, off_reason(request, kind.capability()));
        return Ok(planned);
    }
    if kind != Kind::Plain {
        let target = read_config(target_dir)?;
        if let Some(why) = mismatch(kind, &target, &drafter) {
            fallback(&mut planned, why);
            return Ok(planned);
        }
        if vocab_size(&target).is_none() || vocab_size(&drafter).is_none() {
            planned.notes.push(format!(
                "the vocabularies of draft_model '{shown}' and the model were not compared: a config.json has no vocab_size"
            ));
        }
    }
    let positive = |name: &str| -> Result<Option<u64>, String> {
        match setting(request, name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| invalid(request, name, v, "it must be a whole number above 0")),
        }
    };
    planned.args = vec!["--model-draft".into(), shown.clone()];
    match kind.flag() {
        None => {
            if let Some(n) = positive(names::DRAFT_TOKENS)? {
                planned.args.extend(["--draft-max".into(), n.to_string()]);
            }
            if setting(request, DRAFT_BLOCK_SIZE).is_some() {
                planned.notes.push(format!(
                    "setting '{DRAFT_BLOCK_SIZE}' was not applied: it sizes MTP and DFlash drafter blocks, and this build runs draft_model as a plain draft model"
                ));
            }
        }
        Some(flag) => {
            // `auto` leaves the kind to mlxcel's own detection (the same
            // rule as `detect`), and an unset block size to mlxcel too.
            if !auto {
                planned.args.extend(["--draft-kind".into(), flag.into()]);
            }
            if let Some(block) = positive(DRAFT_BLOCK_SIZE)? {
                planned
                    .args
                    .extend(["--draft-block-size".into(), block.to_string()]);
            }
            if setting(request, names::DRAFT_TOKENS).is_some() {
                planned.notes.push(format!(
                    "setting '{}' was not applied: it sets a plain draft model's --draft-max; {} drafts draft_block_size tokens",
                    names::DRAFT_TOKENS,
                    kind.described()
                ));
            }
        }
    }
    planned.notes.push(format!(
        "speculative decoding with {} ({evidence})",
        kind.described()
    ));
    Ok(planned)
}
