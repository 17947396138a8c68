//! What a model does: chat (text generation), embeddings or reranking.
//!
//! Read from the model's own files, the way the engines that serve it read
//! them, so that the catalog, resolution and the API agree with the engine:
//!
//! - an MLX folder is a **reranker** when `config.json`'s first
//!   architecture is a `…ForSequenceClassification` (a cross-encoder);
//!   else an **embedder** when it carries a sentence-transformers
//!   `modules.json` with a `Pooling` module (Qwen3-Embedding and the like),
//!   or its `model_type` (or architecture) is an encoder of the BERT family;
//!   else a **chat** model;
//! - a GGUF file is a reranker when its `{arch}.pooling_type` is llama.cpp's
//!   `rank` (4), an embedder when it has another pooling type or its
//!   architecture is an encoder (`bert`, `nomic-bert`, …), else chat.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::{gguf_metadata, read_capped, GgufValue, MAX_CONFIG_BYTES};

/// What a model does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Generates text (chat and completions).
    #[default]
    Chat,
    /// Computes embeddings.
    Embedding,
    /// Scores documents against a query (a cross-encoder).
    Rerank,
}

/// `model_type`s (and architectures) of the encoder families that are
/// embedders whatever their sentence-transformers files say.
const ENCODER_TYPES: &[&str] = &[
    "bert",
    "roberta",
    "xlm-roberta",
    "modernbert",
    "nomic_bert",
    "distilbert",
];
const ENCODER_ARCHITECTURES: &[&str] = &[
    "BertModel",
    "RobertaModel",
    "XLMRobertaModel",
    "ModernBertModel",
    "NomicBertModel",
    "DistilBertModel",
];

/// GGUF architectures that are encoders (llama.cpp serves them as embedders).
const GGUF_ENCODERS: &[&str] = &[
    "bert",
    "nomic-bert",
    "nomic-bert-moe",
    "jina-bert-v2",
    "jina-bert-v3",
    "modern-bert",
    "neo-bert",
    "t5encoder",
];

/// llama.cpp's `LLAMA_POOLING_TYPE_RANK`.
const GGUF_POOLING_RANK: u64 = 4;

impl ModelKind {
    /// The word for it (`chat`, `embedding`, `rerank`).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Embedding => "embedding",
            ModelKind::Rerank => "rerank",
        }
    }

    /// The capability an engine needs to serve models of this kind
    /// (`None` for chat, which every engine serves).
    pub fn capability(self) -> Option<&'static str> {
        match self {
            ModelKind::Chat => None,
            ModelKind::Embedding => Some(hangar_plugin_api::capability::EMBEDDINGS),
            ModelKind::Rerank => Some(hangar_plugin_api::capability::RERANK),
        }
    }

    /// The kind of the model at `path` (a folder holding `files`, or a
    /// model file). Whatever cannot be read counts as chat: the checks that
    /// refuse broken models are the recognition rules', not this.
    pub fn of(path: &Path, files: &[String]) -> ModelKind {
        if path.is_file() {
            return gguf_kind(path);
        }
        if files.iter().any(|f| f == "config.json") {
            return folder_kind(path);
        }
        match files.iter().find(|f| f.ends_with(".gguf")) {
            Some(gguf) => gguf_kind(&path.join(gguf)),
            None => ModelKind::Chat,
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&read_capped(path, MAX_CONFIG_BYTES).ok()?).ok()
}

/// What the model folder `path` holding `files` says of its family: the
/// `model_type` of its `config.json` (`None` for a model file, or a config
/// without one) and whether it takes images: a `vision_config` (as
/// Qwen2.5-VL, Gemma 3, LLaVA and the other Hugging Face VLMs write it), or
/// for GGUF a multimodal projector beside the weights (`mmproj-*.gguf`,
/// which llama.cpp loads with `--mmproj`).
pub(crate) fn family_of(path: &Path, files: &[String]) -> (Option<String>, bool) {
    if path.is_file() {
        return (None, false);
    }
    let projector = files
        .iter()
        .any(|f| f.ends_with(".gguf") && f.to_ascii_lowercase().contains("mmproj"));
    if !files.iter().any(|f| f == "config.json") {
        return (None, projector);
    }
    let Some(config) = read_json(&path.join("config.json")) else {
        return (None, false);
    };
    let model_type = config.get("model_type").and_then(Value::as_str);
    let vision = config.get("vision_config").is_some_and(Value::is_object);
    (model_type.map(str::to_string), vision)
}

fn folder_kind(folder: &Path) -> ModelKind {
    let Some(config) = read_json(&folder.join("config.json")) else {
        return ModelKind::Chat;
    };
    let architecture = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if architecture.ends_with("ForSequenceClassification") {
        return ModelKind::Rerank;
    }
    if has_pooling_module(folder) {
        return ModelKind::Embedding;
    }
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if ENCODER_TYPES.contains(&model_type) || ENCODER_ARCHITECTURES.contains(&architecture) {
        return ModelKind::Embedding;
    }
    ModelKind::Chat
}

/// Whether the folder's sentence-transformers `modules.json` lists a
/// pooling module.
fn has_pooling_module(folder: &Path) -> bool {
    let Some(Value::Array(modules)) = read_json(&folder.join("modules.json")) else {
        return false;
    };
    modules.iter().any(|m| {
        m.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with(".Pooling"))
    })
}

fn gguf_kind(file: &Path) -> ModelKind {
    let metadata = gguf_metadata(file, |key| {
        key == b"general.architecture" || key.ends_with(b".pooling_type")
    });
    let architecture = metadata.iter().find_map(|(k, v)| match v {
        GgufValue::Text(a) if k == "general.architecture" => Some(a.as_str()),
        _ => None,
    });
    let pooling = architecture.and_then(|arch| {
        metadata.iter().find_map(|(k, v)| match v {
            GgufValue::Number(n) if *k == format!("{arch}.pooling_type") => Some(*n),
            _ => None,
        })
    });
    match (architecture, pooling) {
        (_, Some(GGUF_POOLING_RANK)) => ModelKind::Rerank,
        // 0 is "none": token embeddings, no pooled vector (chat models
        // written by some converters carry it).
        (_, Some(p)) if p > 0 => ModelKind::Embedding,
        (Some(arch), _) if GGUF_ENCODERS.contains(&arch) => ModelKind::Embedding,
        _ => ModelKind::Chat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[(&str, &str)]) -> (tempfile::TempDir, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let names = files.iter().map(|(n, _)| n.to_string()).collect();
        (dir, names)
    }

    fn kind(files: &[(&str, &str)]) -> ModelKind {
        let (dir, names) = folder(files);
        ModelKind::of(dir.path(), &names)
    }

    #[test]
    fn a_family_and_its_vision_tower_are_read_from_the_folder() {
        let family = |files: &[(&str, &str)]| {
            let (dir, names) = folder(files);
            family_of(dir.path(), &names)
        };
        let vl = r#"{"model_type": "qwen2_5_vl", "vision_config": {"depth": 32}}"#;
        assert_eq!(
            family(&[("config.json", vl)]),
            (Some("qwen2_5_vl".into()), true)
        );
        let text = r#"{"model_type": "qwen3", "vision_config": null}"#;
        assert_eq!(
            family(&[("config.json", text)]),
            (Some("qwen3".into()), false)
        );
        assert_eq!(family(&[("config.json", "not json")]), (None, false));
        // GGUF: a projector beside the weights.
        let gguf = [("model-q4.gguf", ""), ("mmproj-model-f16.gguf", "")];
        assert_eq!(family(&gguf), (None, true));
        assert_eq!(family(&gguf[..1]), (None, false));
    }

    #[test]
    fn folders_are_read_as_their_engines_read_them() {
        let chat = r#"{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}"#;
        assert_eq!(kind(&[("config.json", chat)]), ModelKind::Chat);
        // Qwen3-Embedding: a decoder with sentence-transformers pooling.
        let modules = r#"[{"idx": 0, "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#;
        assert_eq!(
            kind(&[("config.json", chat), ("modules.json", modules)]),
            ModelKind::Embedding
        );
        let bert = r#"{"model_type": "bert", "architectures": ["BertModel"]}"#;
        assert_eq!(kind(&[("config.json", bert)]), ModelKind::Embedding);
        let xlmr = r#"{"model_type": "xlm-roberta"}"#;
        assert_eq!(kind(&[("config.json", xlmr)]), ModelKind::Embedding);
        let reranker = r#"{"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"]}"#;
        assert_eq!(
            kind(&[("config.json", reranker), ("modules.json", modules)]),
            ModelKind::Rerank
        );
        // Unreadable files leave the model a chat model (the rules refuse
        // a broken config.json; a broken modules.json is ignored).
        assert_eq!(
            kind(&[("config.json", chat), ("modules.json", "[not json")]),
            ModelKind::Chat
        );
        assert_eq!(kind(&[("config.json", "{")]), ModelKind::Chat);
    }

    /// A GGUF file holding `entries` (key, value) of metadata, no tensors.
    fn gguf(entries: &[(&str, GgufValue)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((entries.len() as u64).to_le_bytes());
        for (key, value) in entries {
            b.extend((key.len() as u64).to_le_bytes());
            b.extend(key.as_bytes());
            match value {
                GgufValue::Text(t) => {
                    b.extend(8u32.to_le_bytes());
                    b.extend((t.len() as u64).to_le_bytes());
                    b.extend(t.as_bytes());
                }
                GgufValue::Number(n) => {
                    b.extend(4u32.to_le_bytes());
                    b.extend((*n as u32).to_le_bytes());
                }
            }
        }
        b
    }

    fn gguf_file_kind(entries: &[(&str, GgufValue)]) -> ModelKind {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, gguf(entries)).unwrap();
        ModelKind::of(&path, &["m.gguf".into()])
    }

    #[test]
    fn gguf_files_are_read_by_architecture_and_pooling() {
        let text = |s: &str| GgufValue::Text(s.into());
        assert_eq!(
            gguf_file_kind(&[("general.architecture", text("llama"))]),
            ModelKind::Chat
        );
        assert_eq!(
            gguf_file_kind(&[("general.architecture", text("bert"))]),
            ModelKind::Embedding
        );
        assert_eq!(
            gguf_file_kind(&[
                ("general.architecture", text("qwen3")),
                ("qwen3.pooling_type", GgufValue::Number(3)),
            ]),
            ModelKind::Embedding
        );
        assert_eq!(
            gguf_file_kind(&[
                ("general.architecture", text("bert")),
                ("bert.pooling_type", GgufValue::Number(4)),
            ]),
            ModelKind::Rerank
        );
        assert_eq!(
            gguf_file_kind(&[
                ("general.architecture", text("llama")),
                ("llama.pooling_type", GgufValue::Number(0)),
            ]),
            ModelKind::Chat
        );
    }
}
