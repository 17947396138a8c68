//! Example in-process plugin `echo`: an engine that runs inside the
//! calling process and "generates" by echoing the words of the prompt, one
//! token each, a millisecond apart. Deterministic, so the tests can check
//! the host's in-process path (worker isolation, streaming, cancellation,
//! crashes) without a real model. A prompt containing `CRASH` aborts the
//! process, as a crashing engine library would.

use std::ops::ControlFlow;
use std::time::Duration;

use hangar_sdk::wire::{
    Description, GenerateInput, GenerateOutcome, GenerateRequest, LoadRequest, ProbeInput,
    ProbeReport,
};
use hangar_sdk::{export_plugin, Engine, Plugin};

struct Echo;

impl Plugin for Echo {
    fn describe() -> Description {
        hangar_sdk::describe!("echo", formats: ["mlx"])
    }

    fn probe(_input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(ProbeReport {
            available: true,
            version: Some("1.0.0".into()),
            device: Some("cpu".into()),
            ..ProbeReport::default()
        })
    }

    fn load_in_process(request: LoadRequest) -> Result<Box<dyn Engine>, String> {
        if !std::path::Path::new(&request.model_path)
            .join("config.json")
            .is_file()
        {
            return Err(format!("{} has no config.json", request.model_path));
        }
        Ok(Box::new(EchoEngine))
    }
}

struct EchoEngine;

impl Engine for EchoEngine {
    fn generate(
        &self,
        request: GenerateRequest,
        emit: &mut dyn FnMut(&str, u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutcome, String> {
        let prompt = match &request.input {
            GenerateInput::Completion { prompt } => prompt.clone(),
            GenerateInput::Chat { messages } => messages
                .iter()
                .filter_map(|m| m.get("content").and_then(|c| c.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
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
        let mut outcome = GenerateOutcome {
            finish_reason: "length".into(),
            prompt_tokens: words.len() as u32,
            completion_tokens: 0,
            cached_tokens: 0,
        };
        for i in 0..max {
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
}

export_plugin!(Echo);
