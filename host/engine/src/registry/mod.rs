//! The registry: every plugin found in the configured plugin folders, read
//! and validated without running plugin code, and loaded only on demand.
//!
//! A broken plugin never stops the host. Whatever is wrong with it (its
//! manifest, its artifact, its code) becomes a [`Diagnostic`] with a reason
//! a person can act on, and the other plugins load as usual.

mod capabilities;
pub mod probe;
pub mod programs;
pub mod report;
pub mod resolve;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hangar_plugin_api::manifest::MANIFEST_FILE;
use hangar_plugin_api::wire::ProbeReport;
use hangar_plugin_api::{Accelerator, Manifest, Platform};
use semver::Version;
use serde::Serialize;

pub use capabilities::{gate, gate_engine, CapabilityState};

use crate::config::Config;
use crate::loader::LoadedPlugin;
use crate::models::Needs;
use crate::models::{merge_rules, Rule};

/// Format aliases every host knows, before plugins add theirs.
pub const BUILTIN_ALIASES: &[(&str, &str)] = &[("safetensors", "mlx")];

/// A problem with one plugin folder (or with the plugin set as a whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// The plugin folder or plugins dir concerned.
    pub location: PathBuf,
    /// The plugin id, when the manifest got far enough to have one.
    pub plugin: Option<String>,
    /// What is wrong and what to do.
    pub reason: String,
}

/// Where an alias came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alias {
    /// The canonical format.
    pub target: String,
    /// `built-in` or the declaring plugin ids.
    pub declared_by: Vec<String>,
}

/// A plugin whose manifest is valid.
#[derive(Debug)]
pub struct PluginEntry {
    /// The manifest.
    pub manifest: Manifest,
    /// The plugin folder.
    pub dir: PathBuf,
    /// The best accelerator of this machine the plugin can use, or `None`
    /// when no platform entry fits this machine.
    pub accelerator: Option<Accelerator>,
    state: OnceLock<EngineState>,
}

impl PluginEntry {
    /// Whether a platform entry that fits `machine` serves `format` (a
    /// plugin may read some formats only on some platforms).
    pub fn serves_here(&self, format: &str, machine: &Platform) -> bool {
        self.manifest
            .platforms
            .iter()
            .any(|p| p.serves(format) && p.best_match(machine).is_some())
    }
}

/// What loading and probing a plugin gave.
#[derive(Debug, Clone)]
pub enum EngineState {
    /// The artifact or its code is broken; the plugin is skipped.
    Broken(String),
    /// The plugin loaded, but its engine cannot serve here.
    Unavailable {
        /// The loaded plugin.
        plugin: LoadedPlugin,
        /// Why, from the probe.
        reason: String,
    },
    /// The engine can serve.
    Ready(Engine),
}

/// A loaded plugin whose engine is available.
#[derive(Debug, Clone)]
pub struct Engine {
    /// The loaded plugin.
    pub plugin: LoadedPlugin,
    /// What the probe reported.
    pub report: ProbeReport,
    /// The engine version, when it was read unambiguously.
    pub version: Option<Version>,
    /// Every capability of the manifest, on or off.
    pub capabilities: BTreeMap<String, CapabilityState>,
}

/// The set of plugins of this host.
#[derive(Debug)]
pub struct Registry {
    platform: Platform,
    config: Config,
    plugins: Vec<PluginEntry>,
    diagnostics: Vec<Diagnostic>,
    aliases: BTreeMap<String, Alias>,
    rules: Vec<Rule>,
}

impl Registry {
    /// Scans `dirs` in order (earlier folders win on duplicate ids) and
    /// validates every manifest found. No plugin code runs here.
    /// `required_dirs` are the folders the operator named explicitly: their
    /// absence is a diagnostic, while a missing default folder is not.
    pub fn scan(
        dirs: &[PathBuf],
        required_dirs: &[PathBuf],
        config: Config,
        platform: Platform,
    ) -> Registry {
        let mut diagnostics = Vec::new();
        let mut folders: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            // Absolute, since engines and workers run in other folders.
            let dir = &std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) => {
                    if required_dirs
                        .iter()
                        .any(|r| std::path::absolute(r).ok().as_ref() == Some(dir))
                    {
                        diagnostics.push(Diagnostic {
                            location: dir.clone(),
                            plugin: None,
                            reason: format!("cannot read plugins folder: {e}"),
                        });
                    }
                    continue;
                }
            };
            let mut here: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect();
            here.sort();
            folders.extend(here);
        }
        // Reading and validating a manifest is mostly parsing its TOML, and
        // each is independent: they are read on all cores, then taken in
        // scan order.
        let read = in_parallel(&folders, |folder| read_plugin(folder, &platform));
        let mut plugins: Vec<PluginEntry> = Vec::new();
        for (folder, result) in folders.into_iter().zip(read) {
            match result {
                Ok(entry) => match plugins.iter().find(|p| p.manifest.id == entry.manifest.id) {
                    Some(first) => diagnostics.push(Diagnostic {
                        location: folder,
                        plugin: Some(entry.manifest.id.clone()),
                        reason: format!(
                            "duplicate plugin id '{}': {} was found first and is used; remove one of them",
                            entry.manifest.id,
                            first.dir.display()
                        ),
                    }),
                    None => plugins.push(entry),
                },
                Err(reason) => diagnostics.push(Diagnostic {
                    plugin: manifest_id_guess(&folder),
                    location: folder,
                    reason,
                }),
            }
        }
        let aliases = build_aliases(&plugins, &mut diagnostics);
        let rules = build_rules(&plugins, &mut diagnostics);
        Registry {
            platform,
            config,
            plugins,
            diagnostics,
            aliases,
            rules,
        }
    }

    /// This machine's platform as the registry sees it.
    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    /// The operator's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Plugins with valid manifests, in scan order.
    pub fn plugins(&self) -> &[PluginEntry] {
        &self.plugins
    }

    /// The plugin with this id.
    pub fn plugin(&self, id: &str) -> Option<&PluginEntry> {
        self.plugins.iter().find(|p| p.manifest.id == id)
    }

    /// Folders and conflicts that could not become plugins.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    /// The alias table: alias → canonical format.
    pub fn aliases(&self) -> &BTreeMap<String, Alias> {
        &self.aliases
    }

    /// The recognition rules models are found with: the built-in ones,
    /// then plugins' in scan order, conflicts left out (see
    /// [`crate::models`]).
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The canonical name of `format`.
    pub fn canonical_format(&self, format: &str) -> String {
        let format = format.to_ascii_lowercase();
        self.aliases
            .get(&format)
            .map(|a| a.target.clone())
            .unwrap_or(format)
    }

    /// Loads, checks and probes a plugin the first time it is needed;
    /// later calls return the same state.
    pub fn engine<'a>(&self, entry: &'a PluginEntry) -> &'a EngineState {
        entry
            .state
            .get_or_init(|| load_and_probe(entry, &self.config))
    }
}

impl Registry {
    /// The plugin and engine that serve `format`, or why none can (the
    /// resolution's reason and every rejection, in one sentence).
    pub fn serving(
        &self,
        format: &str,
        default_engines: &BTreeMap<String, String>,
    ) -> Result<(&PluginEntry, &Engine), String> {
        self.serving_except(format, &Needs::default(), default_engines, &[])
    }

    /// [`Registry::serving`], passing over the plugins in `skip` (engines
    /// that already failed to load the model): the next compatible engine
    /// in resolution order, for fallback.
    ///
    /// `needs` is what the model asks of its engine
    /// ([`crate::models::Model::needs`]).
    pub fn serving_except(
        &self,
        format: &str,
        needs: &Needs,
        default_engines: &BTreeMap<String, String>,
        skip: &[String],
    ) -> Result<(&PluginEntry, &Engine), String> {
        let resolution = self.resolve_needing(format, needs, default_engines);
        let next = resolution.trace.iter().find(|t| {
            matches!(
                t.verdict,
                resolve::Verdict::Chosen | resolve::Verdict::Outranked
            ) && !skip.iter().any(|s| s == t.plugin)
        });
        if let Some(entry) = next.and_then(|t| self.plugin(t.plugin)) {
            if let EngineState::Ready(engine) = self.engine(entry) {
                return Ok((entry, engine));
            }
        }
        if resolution.chosen.is_some() {
            return Err(format!(
                "every compatible engine was tried ({})",
                skip.join(", ")
            ));
        }
        let rejections: Vec<String> = resolution
            .trace
            .iter()
            .filter_map(|t| match &t.verdict {
                resolve::Verdict::Rejected(r) => Some(format!("{}: {r}", t.plugin)),
                _ => None,
            })
            .collect();
        let mut reason = resolution.reason;
        if !rejections.is_empty() {
            reason.push_str(&format!(" ({})", rejections.join("; ")));
        }
        Err(reason)
    }
}

/// `f` of every item, in order, computed in contiguous runs of items on
/// up to one scoped thread per core (on this thread alone for a few items).
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    /// Fewer items than this per thread are not worth a thread's start.
    const MIN_PER_THREAD: usize = 8;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let per_thread = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let runs: Vec<_> = items
            .chunks(per_thread)
            .map(|run| s.spawn(move || run.iter().map(f).collect::<Vec<R>>()))
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().expect("a manifest reader panicked"))
            .collect()
    })
}

fn read_plugin(folder: &Path, platform: &Platform) -> Result<PluginEntry, String> {
    if !folder.join(MANIFEST_FILE).exists() {
        return Err(format!(
            "no {MANIFEST_FILE} in this folder; a plugin folder holds {MANIFEST_FILE} and its artifact"
        ));
    }
    let manifest = Manifest::from_dir(folder).map_err(|e| e.to_string())?;
    artifact_path(folder, &manifest)?;
    let accelerator = manifest
        .platforms
        .iter()
        .filter_map(|spec| spec.best_match(platform))
        .max_by_key(Accelerator::rank);
    Ok(PluginEntry {
        manifest,
        dir: folder.to_path_buf(),
        accelerator,
        state: OnceLock::new(),
    })
}

/// The id a broken manifest would have had, for the diagnostic.
fn manifest_id_guess(folder: &Path) -> Option<String> {
    let text = std::fs::read_to_string(folder.join(MANIFEST_FILE)).ok()?;
    let table: toml::Table = toml::from_str(&text).ok()?;
    table.get("id")?.as_str().map(str::to_string)
}

fn build_aliases(
    plugins: &[PluginEntry],
    diagnostics: &mut Vec<Diagnostic>,
) -> BTreeMap<String, Alias> {
    let mut declared: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (alias, target) in BUILTIN_ALIASES {
        declared
            .entry(alias.to_string())
            .or_default()
            .entry(target.to_string())
            .or_default()
            .push("built-in".into());
    }
    for p in plugins {
        for (alias, target) in &p.manifest.aliases {
            declared
                .entry(alias.clone())
                .or_default()
                .entry(target.clone())
                .or_default()
                .push(p.manifest.id.clone());
        }
    }
    let served: BTreeSet<&str> = plugins
        .iter()
        .flat_map(|p| p.manifest.formats.iter().map(String::as_str))
        .collect();
    let mut aliases = BTreeMap::new();
    for (alias, targets) in declared {
        let declarers = || {
            targets
                .iter()
                .map(|(t, by)| format!("{} → {t}", by.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        };
        if targets.len() > 1 {
            diagnostics.push(Diagnostic {
                location: PathBuf::from("<registry>"),
                plugin: None,
                reason: format!(
                    "format alias '{alias}' is declared with different targets ({}); the alias is ignored until the plugins agree",
                    declarers()
                ),
            });
            continue;
        }
        if served.contains(alias.as_str()) {
            diagnostics.push(Diagnostic {
                location: PathBuf::from("<registry>"),
                plugin: None,
                reason: format!(
                    "'{alias}' is served as a format by a plugin and declared as an alias ({}); the alias is ignored",
                    declarers()
                ),
            });
            continue;
        }
        let (target, declared_by) = targets.into_iter().next().expect("one target");
        aliases.insert(
            alias,
            Alias {
                target,
                declared_by,
            },
        );
    }
    aliases
}

fn build_rules(plugins: &[PluginEntry], diagnostics: &mut Vec<Diagnostic>) -> Vec<Rule> {
    let (rules, conflicts) = merge_rules(
        plugins
            .iter()
            .map(|p| (p.manifest.id.as_str(), p.manifest.recognize.as_slice())),
    );
    diagnostics.extend(conflicts.into_iter().map(|reason| Diagnostic {
        location: PathBuf::from("<registry>"),
        plugin: None,
        reason,
    }));
    rules
}

/// The step at which loading a plugin's code failed (see [`load_plugin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadStep {
    /// The artifact is missing, of a kind this host cannot load, built for
    /// another machine, or not a Hangar plugin.
    Library,
    /// The plugin's `describe()` failed or panicked.
    Describe,
    /// `describe()` answered, but disagrees with `plugin.toml`.
    Agreement,
}

/// Why a plugin's code could not be loaded: the step, and a reason a
/// person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    /// Where it failed.
    pub step: LoadStep,
    /// What is wrong and what to do.
    pub reason: String,
}

/// Loads the code of the plugin folder `dir`, whose manifest is
/// `manifest`: the artifact (its object header, then `abi_stable`'s layout
/// checks), then its `describe()`, which must agree with the manifest.
///
/// The registry, `hangar worker` and the conformance suite
/// ([`crate::conformance`]) all load plugins through this one function, so
/// a plugin that passes the suite loads in the host.
pub fn load_plugin(dir: &Path, manifest: &Manifest) -> Result<LoadedPlugin, LoadFailure> {
    let failure = |step| move |reason| LoadFailure { step, reason };
    let artifact = artifact_path(dir, manifest).map_err(failure(LoadStep::Library))?;
    let plugin =
        LoadedPlugin::load(manifest.kind, &artifact).map_err(failure(LoadStep::Library))?;
    let description = plugin.describe().map_err(failure(LoadStep::Describe))?;
    check_description(manifest, &description).map_err(failure(LoadStep::Agreement))?;
    Ok(plugin)
}

/// The artifact of the plugin folder `dir`, which must exist.
fn artifact_path(dir: &Path, manifest: &Manifest) -> Result<PathBuf, String> {
    let artifact = dir.join(manifest.artifact_file_name());
    if !artifact.is_file() {
        return Err(format!(
            "artifact {} is missing; build the plugin or reinstall its folder",
            artifact.display()
        ));
    }
    Ok(artifact)
}

fn load_and_probe(entry: &PluginEntry, config: &Config) -> EngineState {
    let manifest = &entry.manifest;
    let plugin = match load_plugin(&entry.dir, manifest) {
        Ok(plugin) => plugin,
        Err(failure) => return EngineState::Broken(failure.reason),
    };
    let settings = config.plugin_settings(&manifest.id);
    // A shell or interpreter the operator did not allow is never run, not
    // even to probe it.
    if let Some(reason) = programs::refused_interpreters(manifest, &settings) {
        return EngineState::Unavailable { plugin, reason };
    }
    let input = probe::input(manifest, &settings);
    let report = match plugin.probe(&input) {
        Ok(report) => report,
        Err(reason) => return EngineState::Broken(reason),
    };
    if !report.available {
        let reason = report
            .detail
            .clone()
            .unwrap_or_else(|| "the probe found no usable engine".into());
        return EngineState::Unavailable { plugin, reason };
    }
    let version = report
        .version
        .as_deref()
        .and_then(hangar_plugin_api::read_engine_version);
    let capabilities = gate_engine(manifest, &report);
    EngineState::Ready(Engine {
        plugin,
        report,
        version,
        capabilities,
    })
}

/// A plugin that lies about itself is refused: its code must say what its
/// manifest says.
pub fn check_description(
    manifest: &Manifest,
    d: &hangar_plugin_api::wire::Description,
) -> Result<(), String> {
    let mut differences = Vec::new();
    if d.id != manifest.id {
        differences.push(format!("id '{}' vs '{}'", d.id, manifest.id));
    }
    if d.version != manifest.version.to_string() {
        differences.push(format!("version {} vs {}", d.version, manifest.version));
    }
    let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
    if set(&d.formats) != set(&manifest.formats) {
        differences.push(format!(
            "formats [{}] vs [{}]",
            d.formats.join(", "),
            manifest.formats.join(", ")
        ));
    }
    if d.aliases != manifest.aliases {
        differences.push(format!("aliases {:?} vs {:?}", d.aliases, manifest.aliases));
    }
    let manifest_caps: BTreeSet<String> = manifest.capabilities.keys().cloned().collect();
    if set(&d.capabilities) != manifest_caps {
        differences.push(format!(
            "capabilities [{}] vs [{}]",
            d.capabilities.join(", "),
            manifest_caps.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let built_major = Version::parse(&d.plugin_api).map(|v| v.major).ok();
    if built_major != Some(hangar_plugin_api::host_version().major) {
        differences.push(format!(
            "built with plugin-api {}, host has {}",
            d.plugin_api,
            hangar_plugin_api::PLUGIN_API_VERSION
        ));
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the plugin's code disagrees with its plugin.toml (code vs manifest: {}); the plugin is refused",
            differences.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::in_parallel;

    #[test]
    fn in_parallel_keeps_the_order_of_the_items() {
        for n in [0, 1, 7, 8, 17, 200, 1001] {
            let items: Vec<usize> = (0..n).collect();
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let got = in_parallel(&items, |&i| {
                threads.lock().unwrap().insert(std::thread::current().id());
                i * 3 + 1
            });
            let want: Vec<usize> = items.iter().map(|i| i * 3 + 1).collect();
            assert_eq!(got, want, "{n} items");
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            if n >= 200 && cores > 1 {
                assert!(
                    threads.lock().unwrap().len() > 1,
                    "{n} items ran on one thread"
                );
            }
        }
    }
}
