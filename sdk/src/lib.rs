//! Write a Hangar engine plugin in plain Rust.
//!
//! A native plugin is a `cdylib` crate with a `plugin.toml` beside its built
//! library. Its code implements [`Plugin`] on a unit struct and exports it
//! with [`export_plugin!`]; the macro writes the `abi_stable` root module,
//! turns every panic into an error the host can report, and converts the
//! plain types of [`hangar_plugin_api::wire`] to and from the ABI's JSON.
//!
//! ```
//! use hangar_sdk::{export_plugin, Plugin, wire::*};
//!
//! struct Echo;
//!
//! impl Plugin for Echo {
//!     fn describe() -> Description {
//!         hangar_sdk::describe!("echo", formats: ["gguf"])
//!     }
//!     fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
//!         Ok(hangar_sdk::version_from_output(&input, |out| out.split_whitespace().last()))
//!     }
//! }
//!
//! export_plugin!(Echo);
//! # fn main() {}
//! ```
//!
//! The crate must also depend on `abi_stable` (the root module's export
//! attribute names it by its crate name) and set
//! `crate-type = ["cdylib"]`.
//!
//! The same source is a WebAssembly plugin when built with
//! `cargo build --target wasm32-unknown-unknown`: there [`export_plugin!`]
//! exports the `hangar:engine@1.0.0` world instead (see the `wasm` module, which is
//! compiled only for that target), and a panic traps the guest after the
//! SDK has handed its message to the host.

// The wasm bindings name this crate by its package name.
extern crate self as hangar_sdk;

#[cfg(not(target_family = "wasm"))]
pub use abi_stable;
pub use hangar_plugin_api as api;
pub use hangar_plugin_api::read_engine_version;
pub use hangar_plugin_api::wire;
pub use serde_json;

use std::ops::ControlFlow;

use serde_json::Value;

use wire::{
    Description, EmbedOutcome, EmbedRequest, GenerateOutcome, GenerateRequest, LaunchPlan,
    LoadRequest, ProbeInput, ProbeReport, ProbeRun, RerankOutcome, RerankRequest,
};

/// An engine plugin. Every function runs behind a panic guard: a panic
/// reaches the host as an error naming the plugin function, never as an
/// unwind across the library boundary.
pub trait Plugin {
    /// What the plugin is; must agree with its `plugin.toml`.
    fn describe() -> Description;

    /// Reads the engine's availability and version from what the host's
    /// probe found (see [`ProbeInput`]).
    fn probe(input: ProbeInput) -> Result<ProbeReport, String>;

    /// Plans the engine process that serves one model. The host spawns it,
    /// waits for readiness and proxies to it; the plugin never spawns.
    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let _ = request;
        Err("this plugin runs no engine process".into())
    }

    /// Loads the model into an engine that runs inside the calling process
    /// (the host, or a `hangar worker` child that isolates it). Plugins
    /// with `in_process = true` in their manifest implement this instead of
    /// [`Plugin::plan_launch`].
    fn load_in_process(request: LoadRequest) -> Result<Box<dyn Engine>, String> {
        let _ = request;
        Err("this plugin runs no in-process engine".into())
    }

    /// Rewrites a client's request body before the host forwards it to the
    /// engine at `route` (`/v1/chat/completions`, …); `None` forwards it
    /// unchanged. Called for WebAssembly plugins (the native ABI 1.0 has no
    /// such call).
    fn map_request(route: &str, body: Value) -> Result<Option<Value>, String> {
        let _ = (route, body);
        Ok(None)
    }

    /// Rewrites the engine's non-streaming response body before the host
    /// returns it to the client; `None` returns it unchanged. Called for
    /// WebAssembly plugins.
    fn map_response(route: &str, body: Value) -> Result<Option<Value>, String> {
        let _ = (route, body);
        Ok(None)
    }
}

/// An engine that runs inside the calling process, serving one model.
///
/// `generate` blocks its thread until the request is done. It calls `emit`
/// with each piece of output (complete UTF-8 text and the token id) and
/// stops as soon as `emit` answers [`ControlFlow::Break`]: the client went
/// away. Panics become errors for the host.
pub trait Engine: Send + Sync + 'static {
    /// Runs one request.
    fn generate(
        &self,
        request: GenerateRequest,
        emit: &mut dyn FnMut(&str, u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutcome, String>;

    /// Embeds one request's inputs (plugin-api 1.4). The default refuses:
    /// an engine that computes embeddings overrides it and declares the
    /// `embeddings` capability in its description.
    fn embed(&self, request: EmbedRequest) -> Result<EmbedOutcome, String> {
        let _ = request;
        Err("this engine computes no embeddings".into())
    }

    /// Scores documents against a query (plugin-api 1.4). The default
    /// refuses: an engine that reranks overrides it and declares the
    /// `rerank` capability.
    fn rerank(&self, request: RerankRequest) -> Result<RerankOutcome, String> {
        let _ = request;
        Err("this engine reranks nothing".into())
    }

    /// What the engine decided at load that an operator should know, one
    /// sentence each (a draft model it does not use, and why): the host
    /// shows them with the session (`/api/sessions`) and records each as
    /// an `engine_note` event (plugin-api 1.6). The default has none.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A [`Description`] for the plugin's package: id and version from the
/// crate, plugin-api version from the SDK, and the given formats, aliases and
/// capabilities (both optional, in this order), as `plugin.toml` declares
/// them:
///
/// ```
/// let description = hangar_sdk::describe!(
///     "my-engine",
///     formats: ["gguf"],
///     aliases: { "gguf-v3" => "gguf" },        // [aliases] gguf-v3 = "gguf"
///     capabilities: ["prompt_cache"],         // [capabilities] prompt_cache = ">=1.1.0"
/// );
/// assert_eq!(description.aliases["gguf-v3"], "gguf");
/// assert_eq!(description.capabilities, ["prompt_cache"]);
/// assert_eq!(description.version, env!("CARGO_PKG_VERSION"));
/// ```
#[macro_export]
macro_rules! describe {
    ($id:expr, formats: [$($format:expr),* $(,)?]
     $(, aliases: {$($alias:expr => $target:expr),* $(,)?})?
     $(, capabilities: [$($cap:expr),* $(,)?])? $(,)?) => {
        $crate::wire::Description::new(
            $id,
            env!("CARGO_PKG_VERSION"),
            [$(::std::string::String::from($format)),*],
        )
        .with_aliases(::std::vec![$($((::std::string::String::from($alias), ::std::string::String::from($target))),*)?]
            as ::std::vec::Vec<(::std::string::String, ::std::string::String)>)
        .with_capabilities(::std::vec![$($(::std::string::String::from($cap)),*)?]
            as ::std::vec::Vec<::std::string::String>)
    };
}

/// A probe report read from a probe program's output: unavailable when the
/// program was missing, failed or timed out; available with the version
/// `parse` finds in its standard output (then standard error) otherwise,
/// or available with an unknown version when `parse` finds none.
///
/// `parse` picks the text that holds the version; the version itself is
/// read by [`read_engine_version`], the host's rule: the first word, a
/// leading `v` dropped, a missing minor or patch taken as 0. So `parse`
/// may return `1.5`, `v2` or `2.3.1-beta (build x)` as they are, and the
/// report says 1.5.0, 2.0.0 and 2.3.1-beta.
pub fn version_from_output(
    input: &ProbeInput,
    parse: impl Fn(&str) -> Option<&str>,
) -> ProbeReport {
    let unavailable = |detail: String| ProbeReport::unavailable(detail);
    match &input.run {
        None => unavailable("the manifest names no probe program".into()),
        Some(ProbeRun::NotFound { searched, .. }) => {
            unavailable(format!("not installed (looked in {})", searched.join(", ")))
        }
        Some(ProbeRun::FailedToStart { program, error, .. }) => {
            unavailable(format!("{program} could not be started: {error}"))
        }
        Some(ProbeRun::TimedOut {
            program, after_ms, ..
        }) => ProbeReport::available(None)
            .with_program(program.clone())
            .with_detail(format!(
                "{program} did not print its version within {after_ms} ms; version unknown, gated capabilities off"
            )),
        Some(ProbeRun::Exited {
            program,
            code,
            stdout,
            stderr,
            ..
        }) => {
            if *code != Some(0) {
                let tail = stderr.lines().last().unwrap_or("").trim();
                return unavailable(format!(
                    "{program} exited with {} while probing: {tail}",
                    code.map_or("a signal".to_string(), |c| format!("code {c}"))
                ));
            }
            let found = parse(stdout).or_else(|| parse(stderr));
            let version = found.and_then(read_engine_version);
            let detail = match (found, &version) {
                (_, Some(_)) => None,
                (Some(text), None) => Some(format!(
                    "version '{text}' is not MAJOR[.MINOR[.PATCH]][-PRE]; version unknown, gated capabilities off"
                )),
                (None, None) => Some(format!(
                    "could not read a version from {program}'s output ({:?}); gated capabilities off",
                    stdout.trim().chars().take(80).collect::<String>()
                )),
            };
            let report = ProbeReport::available(version.map(|v| v.to_string()))
                .with_program(program.clone());
            match detail {
                Some(detail) => report.with_detail(detail),
                None => report,
            }
        }
        // A way of running that a later 1.x host reports: no version read.
        Some(_) => unavailable("the probe program's outcome is unknown to this plugin".into()),
    }
}

/// A panic's message and place: `message at file:line`, as the host
/// reports it.
fn panic_text(info: &std::panic::PanicHookInfo<'_>) -> String {
    let message = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into());
    let at = info
        .location()
        .map(|l| format!(" at {}:{}", l.file(), l.line()))
        .unwrap_or_default();
    format!("{message}{at}")
}

#[cfg(not(target_family = "wasm"))]
mod native;
#[cfg(not(target_family = "wasm"))]
#[doc(hidden)]
pub use native::__private;

#[cfg(target_family = "wasm")]
pub mod wasm;

#[cfg(test)]
mod tests {
    use super::*;

    /// What `version_from_output` reports for a probe program that printed
    /// each of `outputs` and exited with 0, when `parse` takes the text
    /// after the program's name.
    fn check(outputs: &[&str], expect: expect_test::Expect) {
        let reports: Vec<String> = outputs
            .iter()
            .map(|stdout| {
                let input =
                    ProbeInput::new(Some(ProbeRun::exited("/bin/engine", Some(0), *stdout, "")));
                let report = version_from_output(&input, |out| {
                    out.trim().strip_prefix("engine ").map(str::trim)
                });
                let shown = format!(
                    "{stdout:?} → {} {}",
                    report.version.as_deref().unwrap_or("unknown"),
                    report.detail.as_deref().unwrap_or("")
                );
                shown.trim_end().to_string()
            })
            .collect();
        expect.assert_eq(&reports.join("\n"));
    }

    #[test]
    fn versions_are_read_by_the_host_rule() {
        check(
            &[
                "engine 1.5\n",
                "engine v2",
                "engine 2.3.1-beta (build x)",
                "engine 1.2.3",
                "engine nightly-2024",
                "something else",
            ],
            expect_test::expect![[r#"
                "engine 1.5\n" → 1.5.0
                "engine v2" → 2.0.0
                "engine 2.3.1-beta (build x)" → 2.3.1-beta
                "engine 1.2.3" → 1.2.3
                "engine nightly-2024" → unknown version 'nightly-2024' is not MAJOR[.MINOR[.PATCH]][-PRE]; version unknown, gated capabilities off
                "something else" → unknown could not read a version from /bin/engine's output ("something else"); gated capabilities off"#]],
        );
    }
}
