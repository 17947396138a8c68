//! [`PluginTest`]: one plugin folder, loaded exactly as the host loads it,
//! with helpers that call the plugin the way the host would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hangar_plugin_api::manifest::MANIFEST_FILE;
use hangar_plugin_api::wire::{LaunchPlan, LoadRequest, ProbeInput, ProbeReport, ProbeRun};
use hangar_plugin_api::{Accelerator, Manifest, PluginKind};
use serde_json::Value;

use crate::loader::native::InProcessEngine;
use crate::loader::LoadedPlugin;
use crate::models::{self, Model, Rule};
use crate::plugin_folder::{PluginFolder, Profile};
use crate::registry::{self, LoadFailure};

/// How long the conformance suite waits for a plugin.
///
/// A call that outlives its limit fails its check. The call itself cannot
/// be stopped (a thread cannot be killed), so it goes on in the
/// background until the test process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Any plugin function (`probe`, `plan_launch`, `load_in_process`), on
    /// top of the probe program's own timeout for `probe`. Default 10 s.
    pub call: Duration,
    /// One short generation (8 tokens) of an in-process engine. Default
    /// 60 s, enough for a tiny model on a slow CPU.
    pub generate: Duration,
    /// From the sink answering `Stop` to `generate` returning. Default 2 s.
    pub stop: Duration,
    /// From starting the planned engine for the fixture to its readiness
    /// (`serves_fixture`; at most the plan's own start timeout). Default
    /// 60 s.
    pub serve: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            call: Duration::from_secs(10),
            generate: Duration::from_secs(60),
            stop: Duration::from_secs(2),
            serve: Duration::from_secs(60),
        }
    }
}

/// A plugin folder loaded exactly as the host loads it: `plugin.toml` read
/// and validated, then the artifact's object header checked, the library
/// loaded through `abi_stable`, and its `describe()` compared with the
/// manifest (through [`registry::load_plugin`], the host's own code).
///
/// Loading never panics: what went wrong is kept, and
/// [`conformance::run`](super::run) reports it as a failed check (the
/// accessors return it as an error).
///
/// ```no_run
/// use hangar_engine::conformance::{self, PluginTest};
///
/// // In a plugin crate's tests/conformance.rs:
/// let plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR")).unwrap();
/// conformance::assert_conformant(&plugin);
/// ```
#[derive(Debug)]
pub struct PluginTest {
    folder: PluginFolder,
    manifest: Result<Manifest, String>,
    plugin: Option<Result<LoadedPlugin, LoadFailure>>,
    settings: BTreeMap<String, Value>,
    fixture: Option<PathBuf>,
    limits: Limits,
    scratch: tempfile::TempDir,
}

impl PluginTest {
    /// Loads the built plugin folder `dir` (`plugin.toml` beside the
    /// artifact).
    pub fn new(dir: impl AsRef<Path>) -> PluginTest {
        PluginTest::load(PluginFolder::existing(dir.as_ref()))
    }

    /// Builds the plugin crate in `crate_dir` with `cargo build` (the dev
    /// profile, as `cargo test` uses) and loads the plugin folder assembled
    /// from its `plugin.toml` and the library cargo built. Fails only when
    /// the build does; anything wrong with the plugin itself is reported by
    /// the conformance suite.
    pub fn build(crate_dir: impl AsRef<Path>) -> Result<PluginTest, String> {
        PluginFolder::build(crate_dir.as_ref(), Profile::Dev, None).map(PluginTest::load)
    }

    /// [`PluginTest::build`] as `kind`, whatever `plugin.toml` says: a crate
    /// that ships as a native and a WebAssembly plugin tests both
    /// (`PluginKind::Wasm` needs the test kit's `wasm` feature and the
    /// `wasm32-unknown-unknown` target).
    pub fn build_as(crate_dir: impl AsRef<Path>, kind: PluginKind) -> Result<PluginTest, String> {
        PluginFolder::build(crate_dir.as_ref(), Profile::Dev, Some(kind)).map(PluginTest::load)
    }

    /// Loads a plugin folder as [`PluginTest::new`] does, or a crate as
    /// [`PluginTest::build`] does but with `profile`, and as `kind` when
    /// given (what `hangar plugin check` uses).
    pub fn open(
        dir: &Path,
        profile: Profile,
        kind: Option<PluginKind>,
    ) -> Result<PluginTest, String> {
        PluginFolder::open(dir, profile, kind).map(PluginTest::load)
    }

    fn load(folder: PluginFolder) -> PluginTest {
        let manifest = Manifest::from_dir(folder.path()).map_err(|e| e.to_string());
        let plugin = manifest
            .as_ref()
            .ok()
            .map(|m| registry::load_plugin(folder.path(), m));
        PluginTest {
            folder,
            manifest,
            plugin,
            settings: BTreeMap::new(),
            fixture: None,
            limits: Limits::default(),
            scratch: tempfile::Builder::new()
                .prefix("hangar-conformance-")
                .tempdir()
                .expect("a scratch folder in the temp dir"),
        }
    }

    /// The plugin's settings as an operator would write them under
    /// `[plugins.ID]` in `config.toml`; `program` points the probe at an
    /// engine outside `PATH`.
    pub fn with_settings(mut self, settings: BTreeMap<String, Value>) -> PluginTest {
        self.settings = settings;
        self
    }

    /// A representative model (a file or folder) for the suite, instead of
    /// the one `plugin.toml` declares (`[conformance] fixture`). The suite
    /// recognises it with the built-in and the plugin's rules, plans
    /// against it with its real files as `model_files`, and serves it when
    /// the engine is installed. In-process engines need one to pass the
    /// generation checks.
    pub fn with_fixture(mut self, path: impl Into<PathBuf>) -> PluginTest {
        self.fixture = Some(path.into());
        self
    }

    /// The fixture: [`PluginTest::with_fixture`]'s, else the manifest's
    /// `[conformance] fixture` in the plugin folder.
    pub fn fixture(&self) -> Option<PathBuf> {
        self.fixture.clone().or_else(|| {
            let declared = self.manifest.as_ref().ok()?.conformance.fixture.as_ref()?;
            Some(self.dir().join(declared))
        })
    }

    /// The recognition rules the host would use with only this plugin
    /// installed: the built-in ones and the plugin's, merged as the
    /// registry merges them.
    pub fn rules(&self) -> Result<Vec<Rule>, String> {
        let manifest = self.manifest()?;
        let (rules, conflicts) =
            crate::models::merge_rules([(manifest.id.as_str(), manifest.recognize.as_slice())]);
        match conflicts.first() {
            Some(conflict) => Err(conflict.clone()),
            None => Ok(rules),
        }
    }

    /// The fixture as the host recognises it, or why it is not a model
    /// this plugin serves; `None` without a fixture.
    pub fn fixture_model(&self) -> Option<Result<Model, String>> {
        let path = self.fixture()?;
        let recognized = || -> Result<Model, String> {
            let manifest = self.manifest()?;
            if !path.exists() {
                return Err(format!(
                    "the fixture {} does not exist{}",
                    path.display(),
                    match self.fixture {
                        Some(_) => "",
                        None =>
                            "; put the model there or fix `[conformance] fixture` in plugin.toml",
                    }
                ));
            }
            let model = models::recognize(&path, &self.rules()?)?;
            let canonical = manifest
                .aliases
                .get(&model.format)
                .map(String::as_str)
                .or_else(|| {
                    registry::BUILTIN_ALIASES
                        .iter()
                        .find(|(alias, _)| *alias == model.format)
                        .map(|(_, target)| *target)
                })
                .unwrap_or(&model.format);
            if !manifest.formats.iter().any(|f| f == canonical) {
                return Err(format!(
                    "the fixture {} is a '{}' model (rule {}), a format the plugin does not serve ([{}])",
                    path.display(),
                    model.format,
                    model.rule,
                    manifest.formats.join(", ")
                ));
            }
            Ok(model)
        };
        Some(recognized())
    }

    /// Whether the fixture is the manifest's, absent from a plugin folder
    /// taken as it is: an installed plugin, whose package carries no
    /// fixture (in a crate, a missing fixture is the author's to fix).
    pub fn fixture_left_out(&self) -> bool {
        self.fixture.is_none()
            && !self.folder.assembled()
            && self.fixture().is_some_and(|path| !path.exists())
    }

    /// Other time limits than [`Limits::default`].
    pub fn with_limits(mut self, limits: Limits) -> PluginTest {
        self.limits = limits;
        self
    }

    /// The plugin folder.
    pub fn dir(&self) -> &Path {
        self.folder.path()
    }

    /// The time limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The validated manifest, or why `plugin.toml` was refused.
    pub fn manifest(&self) -> Result<&Manifest, String> {
        self.manifest
            .as_ref()
            .map_err(|e| format!("{}: {e}", self.dir().join(MANIFEST_FILE).display()))
    }

    /// The loaded plugin, or why the host would refuse it.
    pub fn plugin(&self) -> Result<LoadedPlugin, String> {
        let manifest = self.manifest()?;
        match &self.plugin {
            Some(Ok(plugin)) => Ok(plugin.clone()),
            Some(Err(failure)) => Err(failure.reason.clone()),
            None => Err(format!("plugin '{}' was not loaded", manifest.id)),
        }
    }

    /// How loading went, step by step (for the suite's first checks).
    pub(super) fn load_outcome(&self) -> Option<&Result<LoadedPlugin, LoadFailure>> {
        self.plugin.as_ref()
    }

    /// The operator settings given with [`PluginTest::with_settings`].
    pub fn settings(&self) -> &BTreeMap<String, Value> {
        &self.settings
    }

    /// Probes the engine as the host does: the manifest's probe program,
    /// found and run by the host's own code under the manifest's timeout,
    /// then the plugin's `probe()`, which must answer within
    /// [`Limits::call`].
    /// A shell or interpreter the settings do not allow is not run: the
    /// host's refusal comes back as the error.
    pub fn probe(&self) -> Result<ProbeReport, String> {
        self.probe_traced().map(|(_, report)| report)
    }

    /// [`PluginTest::probe`], with what running the probe program gave.
    pub(super) fn probe_traced(&self) -> Result<(Option<ProbeRun>, ProbeReport), String> {
        let manifest = self.manifest()?.clone();
        if let Some(refusal) = registry::programs::refused_interpreters(&manifest, &self.settings) {
            return Err(format!(
                "the host refuses plugin '{}': {refusal}",
                manifest.id
            ));
        }
        let settings = self.settings.clone();
        let plugin = self.plugin()?;
        let runs = 1 + manifest.flag_surface.args.len() as u32;
        let limit = manifest.probe.timeout() * runs + self.limits.call;
        let (run, report) = bounded("probe()", limit, move || {
            let input = registry::probe::input(&manifest, &settings);
            let report = plugin.probe(&input);
            (input.run, report)
        })?;
        Ok((run, report?))
    }

    /// Calls the plugin's `probe()` with `run` as the probe program's
    /// outcome, within [`Limits::call`].
    pub fn probe_with(&self, run: Option<ProbeRun>) -> Result<ProbeReport, String> {
        let input = ProbeInput::new(run).with_settings(self.settings.clone());
        let plugin = self.plugin()?;
        bounded("probe()", self.limits.call, move || plugin.probe(&input))?
    }

    /// A load request like the host's for the fixture (see
    /// [`PluginTest::fixture_model`]: its path, format and the files its
    /// rule names), or without one for a scratch model of the manifest's
    /// first format (a folder with a small `config.json`), the accelerator this
    /// machine and the manifest agree on, `engine` as the probe's report,
    /// the capabilities its version turns on, no model settings, the
    /// operator's plugin settings, and loopback port 18080.
    pub fn load_request(&self, engine: ProbeReport) -> Result<LoadRequest, String> {
        let manifest = self.manifest()?;
        let fixture = match self.fixture_left_out() {
            true => None,
            false => self.fixture_model(),
        };
        let (model, model_files, format) = match fixture {
            Some(Ok(model)) => (model.path, model.files, model.format),
            Some(Err(reason)) => return Err(reason),
            None => {
                let format = manifest.formats[0].clone();
                let dir = self.scratch_model(&format)?;
                let files = std::fs::read_dir(&dir)
                    .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                (dir, files, format)
            }
        };
        let work_dir = self.scratch.path().join("work");
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
        let machine = crate::platform::current(None)?;
        let accelerator = manifest
            .platforms
            .iter()
            .filter_map(|spec| spec.best_match(&machine))
            .max_by_key(Accelerator::rank)
            .or_else(|| manifest.platforms.first()?.accelerators.first().cloned())
            .map_or_else(|| "cpu".into(), |a| a.to_string());
        let capabilities = registry::gate_engine(manifest, &engine)
            .into_iter()
            .filter(|(_, state)| state.is_on())
            .map(|(id, _)| id)
            .collect::<Vec<String>>();
        Ok(
            LoadRequest::new("conformance-model", model.display().to_string(), format)
                .with_model_files(model_files)
                .with_accelerator(accelerator)
                .with_engine(engine)
                .with_capabilities(capabilities)
                .with_plugin_settings(self.settings.clone())
                .with_endpoint("127.0.0.1", 18080)
                .with_work_dir(work_dir.display().to_string()),
        )
    }

    /// Calls the plugin's `plan_launch()` within [`Limits::call`].
    pub fn plan_launch(&self, request: &LoadRequest) -> Result<LaunchPlan, String> {
        let plugin = self.plugin()?;
        let request = request.clone();
        bounded("plan_launch()", self.limits.call, move || {
            plugin.plan_launch(&request)
        })?
    }

    /// Calls the plugin's `load_in_process()` within
    /// [`Limits::generate`] (loading weights takes a while).
    pub fn load_in_process(&self, request: &LoadRequest) -> Result<InProcessEngine, String> {
        let plugin = self.plugin()?;
        let request = request.clone();
        bounded("load_in_process()", self.limits.generate, move || {
            plugin.load_in_process(&request)
        })?
    }

    /// A scratch model folder: a small `config.json`, and for `gguf` a
    /// `model.gguf` that holds only the format's magic (plugins plan, they
    /// do not read weights).
    fn scratch_model(&self, format: &str) -> Result<PathBuf, String> {
        let dir = self.scratch.path().join("model");
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("config.json"), SCRATCH_CONFIG))
            .and_then(|()| match format {
                "gguf" => std::fs::write(dir.join("model.gguf"), b"GGUF"),
                _ => Ok(()),
            })
            .map_err(|e| format!("cannot write a scratch model in {}: {e}", dir.display()))?;
        Ok(dir)
    }
}

const SCRATCH_CONFIG: &str = r#"{
  "model_type": "llama",
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "vocab_size": 256,
  "max_position_embeddings": 512
}
"#;

/// Runs `call` on a thread of its own and waits at most `limit` for it.
/// A call that does not answer in time is reported and left running.
pub(super) fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::Builder::new()
        .name(format!("conformance {what}"))
        .spawn(move || {
            let _ = tx.send(call());
        })
        .map_err(|e| format!("cannot start a thread for {what}: {e}"))?;
    rx.recv_timeout(limit).map_err(|e| match e {
        mpsc::RecvTimeoutError::Timeout => format!(
            "{what} did not answer within {:.1} s; the host would wait on it forever",
            limit.as_secs_f64()
        ),
        mpsc::RecvTimeoutError::Disconnected => format!(
            "{what} ended without an answer after {} ms (its thread died)",
            started.elapsed().as_millis()
        ),
    })
}
