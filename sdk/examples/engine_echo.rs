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
//! as it parses any engine's.

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
        let mut description =
            hangar_sdk::describe!("echo", formats: ["mlx"], capabilities: ["tool_calls"]);
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
}

export_plugin!(Echo);
