//! The conformance suite: what every plugin must do for the host to serve
//! it, checked against a built plugin folder.
//!
//! A plugin author runs it in the plugin's own `cargo test` through the
//! test kit (`hangar-sdk-testkit`, which re-exports this module), and an
//! operator or CI runs it on a built folder with `hangar plugin check DIR`.
//! The plugin is loaded with the host's own code ([`PluginTest`]), so a
//! plugin that passes loads in the host.
//!
//! | check | passes when |
//! |---|---|
//! | `manifest_valid` | `plugin.toml` parses and validates, plugin-api requirement included |
//! | `library_loads` | the artifact is a library for this machine that exports the root module, or a WebAssembly component (or the SDK's core module) of the `hangar:engine@1.0.0` world |
//! | `describe_answers` | `describe()` answers (a panic is reported, not propagated) |
//! | `describe_matches_manifest` | `describe()` says what `plugin.toml` says |
//! | `probe_terminates` | the manifest's probe program, run as the host runs it, and `probe()` answer in time |
//! | `probe_without_engine` | with the probe program missing, failing to start or timing out, `probe()` answers without claiming a version |
//! | `fixture_recognized` | the plugin's fixture (`[conformance] fixture`, or [`PluginTest::with_fixture`]) is a model the built-in and the plugin's rules recognise, of a format the plugin serves |
//! | `launch_plan_declared_programs` | for the fixture (else a scratch model holding a `config.json`), the launch plan names a program `plugin.toml` declares (or the probe resolved), a health route, a start timeout, and work files inside the work dir |
//! | `engine_loads` | an in-process plugin loads the representative model |
//! | `generate_one_outcome` | a streamed generation of 8 tokens ends with one outcome: `stop` or `length`, at most 8 tokens |
//! | `generate_stops_quickly` | a sink that answers `Stop` ends generation within [`Limits::stop`] with `cancelled`, no output after it, and the engine serves the next request |
//! | `errors_stay_errors` | a malformed message to `probe`, `plan_launch`, `load_in_process` (native; and `generate`) comes back as an error, not a panic or a trap |
//! | `serves_fixture` | with the engine installed (the probe found it), the planned process started for the fixture becomes ready within [`Limits::serve`] and answers one chat request with an OpenAI chat completion, and one streamed (`chat.completion.chunk` events, then `[DONE]`) |
//!
//! Checks that do not apply (launch plans of in-process plugins, the
//! generation checks of plugins that plan engine processes, serving without
//! a fixture or without the engine) and checks that cannot run after an
//! earlier failure are skipped, with the reason. When the engine is not
//! installed here (or fails to run), `probe()` only sees the missing-engine
//! cases: the report passes and says so in a note, since how the plugin
//! reads a real version went untested.
//!
//! What the suite cannot catch: a plugin that aborts the process (as a
//! crashing engine library does) takes the test process with it, and a
//! call that hangs is reported but keeps its thread until the process
//! ends.

mod plugin_test;
mod serve;

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr};
use hangar_plugin_api::abi::{SinkControl, TokenSink, TokenSink_TO};
use hangar_plugin_api::wire::{
    GenerateInput, GenerateOutcome, GenerateRequest, LaunchPlan, LoadRequest, ProbeReport, ProbeRun,
};
use hangar_plugin_api::Manifest;
use serde::Serialize;

pub use plugin_test::{Limits, PluginTest};

use crate::loader::native::InProcessEngine;
use crate::loader::LoadedPlugin;
use crate::registry::LoadStep;
use plugin_test::bounded;

/// Every check, in the order the suite runs them.
pub const CHECKS: &[&str] = &[
    MANIFEST_VALID,
    LIBRARY_LOADS,
    DESCRIBE_ANSWERS,
    DESCRIBE_MATCHES_MANIFEST,
    PROBE_TERMINATES,
    PROBE_WITHOUT_ENGINE,
    FIXTURE_RECOGNIZED,
    LAUNCH_PLAN_DECLARED_PROGRAMS,
    ENGINE_LOADS,
    GENERATE_ONE_OUTCOME,
    GENERATE_STOPS_QUICKLY,
    ERRORS_STAY_ERRORS,
    SERVES_FIXTURE,
];

/// `plugin.toml` parses and validates.
pub const MANIFEST_VALID: &str = "manifest_valid";
/// The artifact loads as a plugin on this machine.
pub const LIBRARY_LOADS: &str = "library_loads";
/// `describe()` answers.
pub const DESCRIBE_ANSWERS: &str = "describe_answers";
/// `describe()` agrees with `plugin.toml`.
pub const DESCRIBE_MATCHES_MANIFEST: &str = "describe_matches_manifest";
/// The probe, run as the host runs it, answers in time.
pub const PROBE_TERMINATES: &str = "probe_terminates";
/// `probe()` without a usable engine claims no version.
pub const PROBE_WITHOUT_ENGINE: &str = "probe_without_engine";
/// The fixture is a model the plugin's rules recognise.
pub const FIXTURE_RECOGNIZED: &str = "fixture_recognized";
/// The engine, started as planned, serves the fixture.
pub const SERVES_FIXTURE: &str = "serves_fixture";
/// Launch plans name only programs the host may run.
pub const LAUNCH_PLAN_DECLARED_PROGRAMS: &str = "launch_plan_declared_programs";
/// An in-process plugin loads the representative model.
pub const ENGINE_LOADS: &str = "engine_loads";
/// A streamed generation ends with one outcome.
pub const GENERATE_ONE_OUTCOME: &str = "generate_one_outcome";
/// A sink's `Stop` ends generation quickly.
pub const GENERATE_STOPS_QUICKLY: &str = "generate_stops_quickly";
/// Malformed messages come back as errors.
pub const ERRORS_STAY_ERRORS: &str = "errors_stay_errors";

/// How one check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The plugin does what the check asks.
    Pass,
    /// It does not; the verdict says how and what to do.
    Fail,
    /// The check does not apply, or cannot run after an earlier failure.
    Skip,
}

/// One check: its name, outcome, and a sentence saying what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// One of [`CHECKS`].
    pub name: &'static str,
    /// Pass, fail or skip.
    pub outcome: Outcome,
    /// What was seen, in words.
    pub verdict: String,
}

/// The outcome of the suite for one plugin.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The plugin id, or the folder name when the manifest has none.
    pub plugin: String,
    /// Every check, in [`CHECKS`] order.
    pub checks: Vec<Check>,
    /// What the checks could not cover here, in words (an engine that is
    /// not installed leaves `probe()`'s version parsing untested).
    pub notes: Vec<String>,
}

impl Report {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.outcome == Outcome::Fail)
    }

    /// The check called `name`.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    fn record(&mut self, name: &'static str, outcome: Outcome, verdict: impl Into<String>) {
        self.checks.push(Check {
            name,
            outcome,
            verdict: verdict.into(),
        });
    }

    fn pass(&mut self, name: &'static str, verdict: impl Into<String>) {
        self.record(name, Outcome::Pass, verdict);
    }

    fn fail(&mut self, name: &'static str, verdict: impl Into<String>) {
        self.record(name, Outcome::Fail, verdict);
    }

    fn skip(&mut self, name: &'static str, verdict: impl Into<String>) {
        self.record(name, Outcome::Skip, verdict);
    }

    /// Skips every check not yet recorded, and puts them in order.
    fn finish(mut self, why: &str) -> Report {
        for name in CHECKS {
            if self.check(name).is_none() {
                self.skip(name, why);
            }
        }
        self.checks
            .sort_by_key(|c| CHECKS.iter().position(|n| *n == c.name));
        self
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut table = crate::text::table(&["CHECK", "RESULT", "VERDICT"]);
        for check in &self.checks {
            let outcome = match check.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            table.add_row(vec![check.name, outcome, &shorten(&check.verdict, 100)]);
        }
        let count = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        write!(
            f,
            "plugin {}\n{table}\n{} passed, {} failed, {} skipped",
            self.plugin,
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip)
        )?;
        // The table shortens verdicts; a failure is shown whole.
        for check in self.failures() {
            write!(f, "\n- {}: {}", check.name, check.verdict)?;
        }
        for note in &self.notes {
            write!(f, "\nnote: {note}")?;
        }
        Ok(())
    }
}

/// Runs every check against `test`'s plugin.
pub fn run(test: &PluginTest) -> Report {
    let mut report = Report {
        plugin: test
            .dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        checks: Vec::new(),
        notes: Vec::new(),
    };
    let manifest = match test.manifest() {
        Ok(m) => m.clone(),
        Err(reason) => {
            report.fail(MANIFEST_VALID, reason);
            return report.finish("needs a valid plugin.toml");
        }
    };
    report.plugin = manifest.id.clone();
    report.pass(
        MANIFEST_VALID,
        format!(
            "{} {} ({}) serves [{}] at priority {}",
            manifest.id,
            manifest.version,
            manifest.kind,
            manifest.formats.join(", "),
            manifest.priority
        ),
    );
    if !loaded(test, &manifest, &mut report) {
        return report.finish("needs the plugin's code to load");
    }
    let probed = probe_terminates(test, &manifest, &mut report);
    probe_without_engine(test, &manifest, &mut report);
    fixture_recognized(test, &mut report);
    let engine_found = probed.as_ref().is_some_and(|p| p.available);
    let request = match test.load_request(representative_engine(probed)) {
        Ok(request) => request,
        Err(reason) => {
            return report.finish(&format!("no representative load request: {reason}"));
        }
    };
    let engine = if manifest.in_process {
        report.skip(
            LAUNCH_PLAN_DECLARED_PROGRAMS,
            "an in-process plugin runs no engine process",
        );
        in_process(test, &request, &mut report)
    } else {
        let planned = launch_plan(test, &manifest, &request, &mut report);
        let why = "the plugin plans engine processes; it runs no in-process engine";
        for name in [ENGINE_LOADS, GENERATE_ONE_OUTCOME, GENERATE_STOPS_QUICKLY] {
            report.skip(name, why);
        }
        if planned {
            serves_fixture(test, engine_found, &request, &mut report);
        }
        None
    };
    if manifest.in_process {
        report.skip(
            SERVES_FIXTURE,
            "an in-process engine is served by the generation checks above",
        );
    }
    errors_stay_errors(test, engine.as_ref(), &mut report);
    report.finish("needs the engine to load")
}

/// Runs the suite and panics, showing the whole report, when a check
/// fails; returns the report otherwise.
#[track_caller]
pub fn assert_conformant(test: &PluginTest) -> Report {
    let report = run(test);
    if !report.passed() {
        let names: Vec<&str> = report.failures().map(|c| c.name).collect();
        panic!(
            "plugin {} fails the conformance suite ({}):\n{report}",
            report.plugin,
            names.join(", ")
        );
    }
    // Shown by `cargo test -- --nocapture` (and with any failure).
    for note in &report.notes {
        eprintln!("conformance note: {note}");
    }
    report
}

/// The first three load steps, as the host takes them. Returns whether the
/// plugin loaded.
fn loaded(test: &PluginTest, manifest: &Manifest, report: &mut Report) -> bool {
    let steps = [
        (LIBRARY_LOADS, LoadStep::Library),
        (DESCRIBE_ANSWERS, LoadStep::Describe),
        (DESCRIBE_MATCHES_MANIFEST, LoadStep::Agreement),
    ];
    let failed = match test.load_outcome() {
        Some(Ok(_)) => None,
        Some(Err(failure)) => Some(failure),
        None => unreachable!("a valid manifest is always followed by a load"),
    };
    for (name, step) in steps {
        match failed {
            Some(f) if f.step == step => {
                report.fail(name, f.reason.clone());
                return false;
            }
            _ => report.pass(
                name,
                match step {
                    LoadStep::Library => format!(
                        "{} loads on {}/{}",
                        manifest.artifact_file_name(),
                        std::env::consts::OS,
                        std::env::consts::ARCH
                    ),
                    LoadStep::Describe => "describe() answers".to_string(),
                    LoadStep::Agreement => {
                        "id, version, formats, aliases and capability ids agree with plugin.toml"
                            .to_string()
                    }
                },
            ),
        }
    }
    true
}

fn probe_terminates(
    test: &PluginTest,
    manifest: &Manifest,
    report: &mut Report,
) -> Option<ProbeReport> {
    let started = Instant::now();
    match test.probe_traced() {
        Ok((run, probe)) => {
            if let Some(note) = untested_parser(manifest, run.as_ref()) {
                report.notes.push(note);
            }
            report.pass(
                PROBE_TERMINATES,
                format!(
                    "answered in {} ms: {}",
                    started.elapsed().as_millis(),
                    describe_probe(&probe)
                ),
            );
            Some(probe)
        }
        Err(reason) => {
            report.fail(PROBE_TERMINATES, reason);
            None
        }
    }
}

/// Whether the probe program's output reached `probe()` here; if not, a
/// note that says so plainly: the suite passed without testing how the
/// plugin reads a version.
fn untested_parser(manifest: &Manifest, run: Option<&ProbeRun>) -> Option<String> {
    let what = match run? {
        ProbeRun::NotFound { searched, .. } => format!(
            "the engine was not found (looked in {})",
            searched.join(", ")
        ),
        ProbeRun::FailedToStart { program, error, .. } => {
            format!("the engine {program} could not be started ({error})")
        }
        ProbeRun::TimedOut {
            program, after_ms, ..
        } => {
            format!("the engine {program} printed no version within {after_ms} ms")
        }
        ProbeRun::Exited { code: Some(0), .. } => return None,
        ProbeRun::Exited { program, code, .. } => format!(
            "the engine {program} exited with {} while probing",
            code.map_or("a signal".to_string(), |c| format!("code {c}"))
        ),
        // An outcome a later plugin-api adds: nothing to say about it.
        _ => return None,
    };
    Some(format!(
        "{what}, so probe() never read its output: its version parsing was not exercised. Install the engine, or point it at one with `program = \"/path\"` under `[plugins.{}]` in config.toml (PluginTest::with_settings in tests), and run the suite again",
        manifest.id
    ))
}

fn describe_probe(probe: &ProbeReport) -> String {
    let detail = probe
        .detail
        .as_deref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    match (probe.available, &probe.version) {
        (false, _) => format!("unavailable{detail}"),
        (true, Some(version)) => format!("available, engine {version}{detail}"),
        (true, None) => format!("available, version unknown{detail}"),
    }
}

/// With the probe program missing, failing to start or timing out, the
/// plugin must still answer, and cannot know a version.
fn probe_without_engine(test: &PluginTest, manifest: &Manifest, report: &mut Report) {
    let Some(program) = manifest.probe.program.clone() else {
        report.skip(
            PROBE_WITHOUT_ENGINE,
            "the manifest names no probe program; probe() inspects the plugin's own engine",
        );
        return;
    };
    let cases = [
        ("missing", ProbeRun::not_found(["PATH"])),
        (
            "failing to start",
            ProbeRun::failed_to_start(
                format!("/nonexistent/{program}"),
                "Permission denied (os error 13)",
            ),
        ),
        (
            "timing out",
            ProbeRun::timed_out(
                format!("/nonexistent/{program}"),
                manifest.probe.timeout().as_millis() as u64,
            ),
        ),
    ];
    let mut seen = Vec::new();
    for (case, run) in cases {
        match test.probe_with(Some(run)) {
            Err(reason) => {
                return report.fail(
                    PROBE_WITHOUT_ENGINE,
                    format!("with the probe program {case}: {reason}"),
                )
            }
            Ok(probe) if probe.version.is_some() => {
                return report.fail(
                    PROBE_WITHOUT_ENGINE,
                    format!(
                        "with the probe program {case}, probe() claims engine version {}; report it unavailable, or available with an unknown version",
                        probe.version.unwrap_or_default()
                    ),
                )
            }
            Ok(probe) => seen.push(format!(
                "{case} → {}",
                if probe.available {
                    "version unknown"
                } else {
                    "unavailable"
                }
            )),
        }
    }
    report.pass(PROBE_WITHOUT_ENGINE, seen.join("; "));
}

/// The engine the representative request names: the probed one when it is
/// available, else one whose version is unknown (the plugin must still
/// plan: the host plans for such engines with every gated capability off).
fn representative_engine(probed: Option<ProbeReport>) -> ProbeReport {
    match probed {
        Some(report) if report.available => report,
        other => {
            let report = ProbeReport::available(None)
                .with_detail("conformance: the engine is not installed here");
            match other.and_then(|r| r.program) {
                Some(program) => report.with_program(program),
                None => report,
            }
        }
    }
}

/// Records `fixture_recognized`.
fn fixture_recognized(test: &PluginTest, report: &mut Report) {
    match test.fixture_model() {
        None => report.skip(
            FIXTURE_RECOGNIZED,
            "no fixture declared (`[conformance] fixture` in plugin.toml, PluginTest::with_fixture, or `hangar plugin check --model`); plans are checked against a scratch model holding only config.json",
        ),
        Some(Err(_)) if test.fixture_left_out() => report.skip(
            FIXTURE_RECOGNIZED,
            format!(
                "plugin.toml's fixture {} is not in this folder: an installed plugin's package carries no fixture, so plans are checked against a scratch model; check the plugin's crate, or pass --model",
                test.fixture().unwrap_or_default().display()
            ),
        ),
        Some(Err(reason)) => report.fail(FIXTURE_RECOGNIZED, reason),
        Some(Ok(model)) => report.pass(
            FIXTURE_RECOGNIZED,
            format!(
                "{} is the {} model '{}' (rule {}); model_files [{}]",
                model.path.display(),
                model.format,
                model.id,
                model.rule,
                model.files.join(", ")
            ),
        ),
    }
}

/// Records `serves_fixture`: the plan for the fixture, on a free port, run.
fn serves_fixture(
    test: &PluginTest,
    engine_found: bool,
    request: &LoadRequest,
    report: &mut Report,
) {
    if test.fixture_left_out() || !matches!(test.fixture_model(), Some(Ok(_))) {
        return report.skip(
            SERVES_FIXTURE,
            "no fixture to serve (see fixture_recognized)",
        );
    }
    if !engine_found {
        return report.skip(
            SERVES_FIXTURE,
            "the engine is not installed here (the probe did not find it), so the fixture was not served",
        );
    }
    let mut request = request.clone();
    let served = serve::free_port().and_then(|port| {
        request.port = port;
        let plan = test.plan_launch(&request)?;
        serve::serve(&request, &plan, test.limits().serve, test.limits().generate)
    });
    match served {
        Ok(seen) => report.pass(SERVES_FIXTURE, seen),
        Err(reason) => report.fail(
            SERVES_FIXTURE,
            format!("serving the fixture failed: {reason}"),
        ),
    }
}

/// Records `launch_plan_declared_programs`; returns whether it passed.
fn launch_plan(
    test: &PluginTest,
    manifest: &Manifest,
    request: &LoadRequest,
    report: &mut Report,
) -> bool {
    let plan = match test.plan_launch(request) {
        Ok(plan) => plan,
        Err(reason) => {
            report.fail(
                LAUNCH_PLAN_DECLARED_PROGRAMS,
                format!(
                    "planning model {} ({}) failed: {reason}",
                    request.model_path, request.format
                ),
            );
            return false;
        }
    };
    match plan_problem(manifest, test.settings(), request, &plan) {
        Some(problem) => {
            report.fail(LAUNCH_PLAN_DECLARED_PROGRAMS, problem);
            false
        }
        None => {
            report.pass(
                LAUNCH_PLAN_DECLARED_PROGRAMS,
                format!(
                    "plans `{}`, ready when GET {} answers {} (start timeout {} s)",
                    shorten(&command_line(&plan), 100),
                    plan.readiness.health_path,
                    plan.readiness.ready_status,
                    plan.start_timeout_ms / 1000
                ),
            );
            true
        }
    }
}

/// What the host would refuse in `plan`, if anything. The program rule is
/// the host's ([`crate::registry::programs::undeclared_program`]): the
/// probe's resolved program, or a program `plugin.toml` declares, and a
/// shell or interpreter only where the operator's `settings` allow it.
fn plan_problem(
    manifest: &Manifest,
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
    request: &LoadRequest,
    plan: &LaunchPlan,
) -> Option<String> {
    let probed = request.engine.program.as_deref();
    if let Some(why) =
        crate::registry::programs::undeclared_program(manifest, settings, probed, &plan.program)
    {
        return Some(format!("the host would refuse the plan: it {why}"));
    }
    if !plan.readiness.health_path.starts_with('/') {
        return Some(format!(
            "readiness.health_path '{}' must be a route starting with '/'",
            plan.readiness.health_path
        ));
    }
    if plan.start_timeout_ms == 0 {
        return Some("start_timeout_ms is 0: the engine could never become ready".into());
    }
    let escapes = |name: &str| {
        let path = std::path::Path::new(name);
        name.is_empty()
            || path.is_absolute()
            || path
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
    };
    if let Some(name) = plan.files.keys().find(|n| escapes(n)) {
        return Some(format!(
            "the plan asks the host to write '{name}', which is not a path inside the session's work dir"
        ));
    }
    None
}

fn command_line(plan: &LaunchPlan) -> String {
    std::iter::once(plan.program.as_str())
        .chain(plan.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn in_process(
    test: &PluginTest,
    request: &LoadRequest,
    report: &mut Report,
) -> Option<Arc<InProcessEngine>> {
    let started = Instant::now();
    let engine = match test.load_in_process(request) {
        Ok(engine) => Arc::new(engine),
        Err(reason) => {
            report.fail(
                ENGINE_LOADS,
                format!(
                    "loading model {} failed: {reason} (give the suite a real model: `[conformance] fixture` in plugin.toml, PluginTest::with_fixture, or `hangar plugin check --model DIR`)",
                    request.model_path
                ),
            );
            return None;
        }
    };
    report.pass(
        ENGINE_LOADS,
        format!(
            "loaded {} in {} ms",
            request.model_path,
            started.elapsed().as_millis()
        ),
    );
    generate_one_outcome(&engine, test.limits(), report);
    generate_stops_quickly(&engine, test.limits(), report);
    Some(engine)
}

const PROMPT: &str = "Hangar conformance: count one two three four five";
const SHORT: u32 = 8;

fn request(max_tokens: u32) -> String {
    let request = GenerateRequest::new(GenerateInput::completion(PROMPT))
        .with_max_tokens(max_tokens)
        .with_temperature(0.0)
        .with_seed(0);
    serde_json::to_string(&request).expect("requests serialize")
}

fn generate_one_outcome(engine: &Arc<InProcessEngine>, limits: Limits, report: &mut Report) {
    let run = match generate(engine, request(SHORT), None, limits) {
        Ok(run) => run,
        Err(reason) => return report.fail(GENERATE_ONE_OUTCOME, reason),
    };
    let outcome = match run.result {
        Ok(outcome) => outcome,
        Err(e) => return report.fail(GENERATE_ONE_OUTCOME, format!("generate() failed: {e}")),
    };
    let problem = if !["stop", "length"].contains(&outcome.finish_reason.as_str()) {
        Some(format!(
            "finish_reason is '{}'; a generation the sink did not stop ends with 'stop' or 'length'",
            outcome.finish_reason
        ))
    } else if outcome.completion_tokens > SHORT {
        Some(format!(
            "{} tokens generated for max_tokens = {SHORT}",
            outcome.completion_tokens
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => report.fail(GENERATE_ONE_OUTCOME, problem),
        None => report.pass(
            GENERATE_ONE_OUTCOME,
            format!(
                "one outcome, '{}' after {} tokens ({} pieces streamed) in {} ms",
                outcome.finish_reason,
                outcome.completion_tokens,
                run.pieces,
                run.took.as_millis()
            ),
        ),
    }
}

fn generate_stops_quickly(engine: &Arc<InProcessEngine>, limits: Limits, report: &mut Report) {
    let run = match generate(engine, request(10_000), Some(1), limits) {
        Ok(run) => run,
        Err(reason) => return report.fail(GENERATE_STOPS_QUICKLY, reason),
    };
    let Some(stopped_after) = run.stop_latency else {
        return match run.result {
            Ok(_) => report.skip(
                GENERATE_STOPS_QUICKLY,
                "the engine finished without output, so there was nothing to stop",
            ),
            Err(e) => report.fail(GENERATE_STOPS_QUICKLY, format!("generate() failed: {e}")),
        };
    };
    let problem = match &run.result {
        Err(e) => Some(format!("after the sink said stop, generate() failed: {e}")),
        Ok(o) if o.finish_reason != "cancelled" => Some(format!(
            "after the sink said stop, finish_reason is '{}', not 'cancelled'",
            o.finish_reason
        )),
        Ok(_) if run.after_stop > 0 => Some(format!(
            "emit() was called {} more times after the sink said stop; stop at the first Stop",
            run.after_stop
        )),
        Ok(_) => None,
    };
    if let Some(problem) = problem {
        return report.fail(GENERATE_STOPS_QUICKLY, problem);
    }
    let next = generate(engine, request(2), None, limits)
        .and_then(|run| run.result.map_err(|e| format!("generate() failed: {e}")));
    match next {
        Err(reason) => report.fail(
            GENERATE_STOPS_QUICKLY,
            format!("the request after a cancelled one was not served: {reason}"),
        ),
        Ok(_) => report.pass(
            GENERATE_STOPS_QUICKLY,
            format!(
                "returned 'cancelled' {} ms after the sink said stop; the next request was served",
                stopped_after.as_millis()
            ),
        ),
    }
}

/// One generation, watched from the outside.
struct Generation {
    result: Result<GenerateOutcome, String>,
    pieces: usize,
    took: Duration,
    /// From the sink's `Stop` to `generate` returning.
    stop_latency: Option<Duration>,
    /// `emit` calls after the sink said stop.
    after_stop: usize,
}

#[derive(Default)]
struct Record {
    pieces: usize,
    stopped: Option<Instant>,
    after_stop: usize,
}

/// The sink the suite hands the engine: counts pieces, and answers `Stop`
/// once `stop_after` pieces arrived.
struct RecordingSink {
    record: Arc<Mutex<Record>>,
    stop_after: Option<usize>,
}

impl TokenSink for RecordingSink {
    fn emit(&mut self, _text: RStr<'_>, _token: u32) -> SinkControl {
        let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        if record.stopped.is_some() {
            record.after_stop += 1;
            return SinkControl::Stop;
        }
        record.pieces += 1;
        if self.stop_after.is_some_and(|n| record.pieces >= n) {
            record.stopped = Some(Instant::now());
            return SinkControl::Stop;
        }
        SinkControl::Continue
    }
}

/// Runs `request` on a thread of its own; gives up after
/// [`Limits::generate`], or [`Limits::stop`] after the sink said stop.
fn generate(
    engine: &Arc<InProcessEngine>,
    request: String,
    stop_after: Option<usize>,
    limits: Limits,
) -> Result<Generation, String> {
    let record = Arc::new(Mutex::new(Record::default()));
    let mut sink = RecordingSink {
        record: record.clone(),
        stop_after,
    };
    let engine = engine.clone();
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::Builder::new()
        .name("conformance generate()".into())
        .spawn(move || {
            let result = match engine.generate(
                RStr::from_str(&request),
                TokenSink_TO::from_ptr(&mut sink, TD_Opaque),
            ) {
                RResult::ROk(out) => {
                    serde_json::from_str::<GenerateOutcome>(out.as_str()).map_err(|e| {
                        format!("generate() returned an outcome the host cannot read: {e}")
                    })
                }
                RResult::RErr(e) => Err(e.into_string()),
            };
            let _ = tx.send((Instant::now(), result));
        })
        .map_err(|e| format!("cannot start a thread for generate(): {e}"))?;
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok((ended, result)) => {
                let record = record.lock().unwrap_or_else(|e| e.into_inner());
                return Ok(Generation {
                    result,
                    pieces: record.pieces,
                    took: ended - started,
                    stop_latency: record.stopped.map(|at| ended.saturating_duration_since(at)),
                    after_stop: record.after_stop,
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("generate()'s thread ended without an answer".into())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let record = record.lock().unwrap_or_else(|e| e.into_inner());
                match record.stopped {
                    Some(at) if at.elapsed() > limits.stop => {
                        return Err(format!(
                            "generate() was still running {:.1} s after the sink said stop ({} more pieces); check the sink's answer after every token",
                            limits.stop.as_secs_f64(),
                            record.after_stop
                        ))
                    }
                    None if started.elapsed() > limits.generate => {
                        return Err(format!(
                            "generate() did not finish {SHORT} tokens within {} s ({} pieces so far)",
                            limits.generate.as_secs(),
                            record.pieces
                        ))
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Malformed messages must come back as errors: through the SDK's guard a
/// decoding error or a panic is an `RErr`, never an unwind or an abort.
fn errors_stay_errors(
    test: &PluginTest,
    engine: Option<&Arc<InProcessEngine>>,
    report: &mut Report,
) {
    const MALFORMED: &str = "this is not a JSON message";
    let Ok(plugin) = test.plugin() else {
        return;
    };
    let limit = test.limits().call;
    let mut answered = Vec::new();
    match plugin {
        LoadedPlugin::Native(native) => {
            let module = native.module();
            for (name, function) in [
                ("probe", module.probe()),
                ("plan_launch", module.plan_launch()),
            ] {
                let call = bounded(name, limit, move || {
                    matches!(function(RStr::from_str(MALFORMED)), RResult::RErr(_))
                });
                answered.push((name, call));
            }
            let load = module.load_in_process();
            answered.push((
                "load_in_process",
                bounded("load_in_process", limit, move || {
                    matches!(load(RStr::from_str(MALFORMED)), RResult::RErr(_))
                }),
            ));
        }
        #[cfg(feature = "wasm")]
        LoadedPlugin::Wasm(wasm) => {
            for name in ["probe", "plan_launch"] {
                let wasm = wasm.clone();
                let call = bounded(name, limit, move || {
                    wasm.call_json(name, MALFORMED).is_err()
                });
                answered.push((name, call));
            }
        }
    }
    if let Some(engine) = engine {
        let run = generate(engine, MALFORMED.into(), None, test.limits());
        answered.push(("generate", run.map(|r| r.result.is_err())));
    }
    let names: Vec<&str> = answered.iter().map(|(n, _)| *n).collect();
    for (name, call) in answered {
        match call {
            Err(reason) => return report.fail(ERRORS_STAY_ERRORS, reason),
            Ok(false) => {
                return report.fail(
                    ERRORS_STAY_ERRORS,
                    format!("{name}() accepted a malformed message instead of answering an error"),
                )
            }
            Ok(true) => {}
        }
    }
    report.pass(
        ERRORS_STAY_ERRORS,
        format!(
            "malformed messages to {} came back as errors",
            names.join(", ")
        ),
    );
}
