//! Example in-process plugin `echo`: an engine that runs inside the
//! calling process and "generates" by echoing the words of the prompt, one
//! token each, a millisecond apart. Deterministic, so the tests can check
//! the host's in-process path (worker isolation, streaming, cancellation,
//! crashes) without a real model. A prompt containing `CRASH` aborts the
//! process, as a crashing engine library would. The word `<|eos|>` ends
//! the answer there with `stop`, as a model's end-of-turn token does. Its
//! calls share nothing, so it declares that it serves two at once
//! (`concurrent_generates`), as a batching engine would; the host queues
//! the rest. It declares `tool_calls`: a prompt holding a tool call's
//! markup comes back as an answer that calls a tool, which the host parses
//! as it parses any engine's. It also embeds and reranks (`embeddings`,
//! `rerank`), as plainly: an input's vector counts its words by a hash of
//! each into eight buckets, normalised; a document's score is how many of
//! the query's words it holds. An input of more than 32 words is refused,
//! as a model refuses one longer than it reads. A model folder with an
//! `echo-note.txt` gives that text as the engine's note (plugin-api 1.6),
//! as an engine says what it decided at load.

use std::ops::ControlFlow;
use std::time::Duration;

use hangar_sdk::wire::{
    Description, EmbedInput, EmbedOutcome, EmbedRequest, GenerateInput, GenerateOutcome,
    GenerateRequest, LoadRequest, ProbeInput, ProbeReport, RerankOutcome, RerankRequest,
};
use hangar_sdk::{export_plugin, Engine, Plugin};

struct Echo;

impl Plugin for Echo {
    fn describe() -> Description {
        let mut description = hangar_sdk::describe!("echo", formats: ["mlx"], capabilities: ["tool_calls", "embeddings", "rerank"]);
        description.concurrent_generates = Some(2);
        description
    }

    fn probe(_input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(ProbeReport::available(Some("1.0.0".into())).with_device("cpu"))
    }

    fn load_in_process(request: LoadRequest) -> Result<Box<dyn Engine>, String> {
        if !std::path::Path::new(&request.model_path)
            .join("config.json")
            .is_file()
        {
            return Err(format!("{} has no config.json", request.model_path));
        }
        let note = std::fs::read_to_string(
            std::path::Path::new(&request.model_path).join("echo-note.txt"),
        );
        Ok(Box::new(EchoEngine {
            notes: note.into_iter().map(|n| n.trim().to_string()).collect(),
        }))
    }
}

struct EchoEngine {
    notes: Vec<String>,
}

impl Engine for EchoEngine {
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn generate(
        &self,
        request: GenerateRequest,
        emit: &mut dyn FnMut(&str, u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutcome, String> {
        let prompt = match &request.input {
            GenerateInput::Completion { prompt, .. } => prompt.clone(),
            GenerateInput::Chat { messages, .. } => messages
                .iter()
                .filter_map(|m| m.get("content").and_then(|c| c.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
            // An input a later plugin-api adds: refused, not guessed at.
            _ => return Err("echo serves chat and completion inputs".into()),
        };
        if prompt.contains("CRASH") {
            std::process::abort();
        }
        let words: Vec<&str> = prompt.split_whitespace().collect();
        if words.is_empty() {
            return Err("the prompt is empty".into());
        }
        let max = request.max_tokens.unwrap_or(16);
        let mut text = String::new();
        let mut outcome = GenerateOutcome::new("length", words.len() as u32, 0);
        for i in 0..max {
            if words[i as usize % words.len()] == "<|eos|>" {
                outcome.finish_reason = "stop".into();
                break;
            }
            let word = format!("{} ", words[i as usize % words.len()]);
            std::thread::sleep(Duration::from_millis(1));
            outcome.completion_tokens += 1;
            text.push_str(&word);
            if request.stop.iter().any(|s| text.contains(s.as_str())) {
                outcome.finish_reason = "stop".into();
                break;
            }
            if emit(&word, i).is_break() {
                outcome.finish_reason = "cancelled".into();
                break;
            }
        }
        Ok(outcome)
    }

    fn embed(&self, request: EmbedRequest) -> Result<EmbedOutcome, String> {
        let mut vectors = Vec::new();
        let mut tokens = 0;
        for (i, input) in request.inputs.iter().enumerate() {
            let ids: Vec<u64> = match input {
                EmbedInput::Text(text) => text.split_whitespace().map(word_id).collect(),
                EmbedInput::Tokens(ids) => ids.iter().map(|&id| u64::from(id)).collect(),
                _ => return Err("echo embeds text and token ids".into()),
            };
            if ids.len() > MAX_WORDS {
                return Ok(EmbedOutcome::refused(
                    i as u32,
                    format!(
                        "input {i} has {} tokens; echo reads at most {MAX_WORDS}",
                        ids.len()
                    ),
                ));
            }
            let mut vector = [0f32; 8];
            for id in &ids {
                vector[(id % 8) as usize] += 1.0;
            }
            let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            vectors.push(vector.iter().map(|x| x / norm).collect());
            tokens += ids.len() as u32;
        }
        Ok(EmbedOutcome::new(vectors, tokens, "mean", true))
    }

    fn rerank(&self, request: RerankRequest) -> Result<RerankOutcome, String> {
        let query: Vec<&str> = request.query.split_whitespace().collect();
        let mut tokens = 0;
        let mut scores = Vec::new();
        for (i, document) in request.documents.iter().enumerate() {
            let words: Vec<&str> = document.split_whitespace().collect();
            if query.len() + words.len() > MAX_WORDS {
                return Ok(RerankOutcome::refused(
                    i as u32,
                    format!("document {i} and the query hold more than {MAX_WORDS} tokens"),
                ));
            }
            tokens += (query.len() + words.len()) as u32;
            scores.push(query.iter().filter(|q| words.contains(q)).count() as f32);
        }
        Ok(RerankOutcome::new(scores, tokens))
    }
}

/// The most words echo embeds or scores at once.
const MAX_WORDS: usize = 32;

/// A word's token id: a stable hash of its bytes (FNV-1a).
fn word_id(word: &str) -> u64 {
    word.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

export_plugin!(Echo);
