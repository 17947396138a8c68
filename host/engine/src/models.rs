//! Model discovery: every model in the configured model dirs, with its id,
//! format and weight size, and a reason for everything that is not a model.
//!
//! What a model looks like on disk is declared, never hard-coded: a
//! [`Rule`] (a manifest's [`RecognitionRule`]) says that a single file
//! whose name matches a pattern is a model (`*.gguf`, `*.toy`), or that a
//! folder holding files for a set of patterns is one (`config.json` +
//! `*.safetensors`). The host's own rules ([`BUILTIN_RECOGNITION`]: `mlx`
//! and `gguf`) are declarations of the same kind as plugins'; the registry
//! merges them ([`crate::registry::Registry::rules`]) and [`discover`]
//! takes the result. The first rule that matches wins, built-in rules
//! first, then plugins' in scan order.
//!
//! Two layouts are read, and one model dir may mix them:
//!
//! - **folders** (the oMLX layout): every subfolder of a model dir is a
//!   model named after the folder, and a file directly in a model dir that
//!   a file rule matches is a model named after the file's stem;
//! - **the Hugging Face cache**: a folder `models--ORG--NAME` is the model
//!   `ORG/NAME`, and its files live in `snapshots/REVISION/` (usually as
//!   symlinks into `blobs/`). The revision `refs/main` names is taken, else the
//!   most recently modified snapshot. A model dir holding `hub/` is a Hugging
//!   Face home (`~/.cache/huggingface`) and only its `hub/` is read.
//!
//! Like the registry, discovery never fails as a whole: whatever is wrong
//! with one folder becomes a [`NotAModel`] saying what to do (and which
//! rules were tried), and the other models are still found. Hidden entries,
//! `datasets--*` and `spaces--*` folders, and files no file rule matches
//! are skipped silently.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hangar_plugin_api::manifest::{name_matches, ContentCheck, RecognitionRule};
use serde::{Deserialize, Serialize};

mod kind;
pub use kind::ModelKind;

/// The largest header a safetensors file may declare; the reference
/// implementation refuses anything bigger, so a bigger one means the file
/// is not safetensors at all.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The most of a JSON-checked file (a `config.json`) that is read: real
/// ones are kilobytes, and a link to a device or a runaway file must not
/// fill the host's memory.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The most of a Hugging Face `refs/main` that is read (it holds a hash).
const MAX_REF_BYTES: u64 = 4 << 10;

/// The host's own recognition rules, declared as a plugin declares its
/// own (`[[recognize]]` in `plugin.toml`). A folder holding a `.gguf` file
/// is `gguf` even when it also holds safetensors, as the gguf rules come
/// first.
pub const BUILTIN_RECOGNITION: &str = r#"
[[recognize]]
format = "gguf"
file = "*.gguf"
checks = { "*.gguf" = "gguf" }

[[recognize]]
format = "gguf"
folder = ["*.gguf"]
weights = ["*.gguf"]
checks = { "*.gguf" = "gguf" }

[[recognize]]
format = "mlx"
folder = ["config.json", "*.safetensors"]
weights = ["*.safetensors"]
checks = { "config.json" = "json", "*.safetensors" = "safetensors" }
"#;

/// The name rules of [`BUILTIN_RECOGNITION`] are declared by.
pub const BUILTIN: &str = "built-in";

/// A recognition rule and who declared it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// The declaration.
    #[serde(flatten)]
    pub spec: RecognitionRule,
    /// `built-in` or the ids of the plugins that declare it.
    pub declared_by: Vec<String>,
}

impl Rule {
    /// `toy: *.toy (toy-plugin)`, for reasons and tables.
    pub fn describe(&self) -> String {
        format!(
            "{}: {} ({})",
            self.spec.format,
            self.spec.describe(),
            self.declared_by.join(", ")
        )
    }
}

/// The host's own rules ([`BUILTIN_RECOGNITION`]).
pub fn builtin_rules() -> Vec<Rule> {
    #[derive(Deserialize)]
    struct Declared {
        recognize: Vec<RecognitionRule>,
    }
    let declared: Declared =
        toml::from_str(BUILTIN_RECOGNITION).expect("the built-in recognition rules parse");
    declared
        .recognize
        .into_iter()
        .map(|spec| Rule {
            spec,
            declared_by: vec![BUILTIN.into()],
        })
        .collect()
}

/// A model found in a model dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Model {
    /// What clients call the model: the folder name, a model file's stem,
    /// or `ORG/NAME` for the Hugging Face cache.
    pub id: String,
    /// The model folder (for the Hugging Face cache, the snapshot folder) or
    /// the model file.
    pub path: PathBuf,
    /// The format the matching rule gives, before alias resolution
    /// (`mlx`, `gguf`).
    pub format: String,
    /// Which layout the model was found in.
    pub source: ModelSource,
    /// The weights on disk: the summed sizes of the files the rule counts
    /// as weights (`*.safetensors`, `*.gguf`), following symlinks (the
    /// Hugging Face cache links into `blobs/`).
    pub size_bytes: u64,
    /// The files the engine needs, as the plugin's `LoadRequest.model_files`:
    /// names inside the folder, or the file's own name.
    pub files: Vec<String>,
    /// The rule that recognised it: `toy: *.toy (toy-plugin)`.
    pub rule: String,
    /// What it does (chat, embeddings, reranking), from its own files.
    pub kind: ModelKind,
    /// Its family as its `config.json` names it (`qwen3`, `gemma3_text`);
    /// `None` for a model file or a folder without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// Whether it takes images (a vision-language model: its config has a
    /// vision tower); images sent to any other model are refused.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub vision: bool,
}

impl Model {
    /// What the model asks of the engine that serves it, beside its format.
    pub fn needs(&self) -> Needs {
        Needs {
            capability: self.kind.capability(),
            model_type: self.model_type.clone(),
        }
    }
}

/// What a model asks of the engine that serves it, beside its format:
/// resolution passes over engines that cannot give it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Needs {
    /// The capability its kind needs ([`ModelKind::capability`]).
    pub capability: Option<&'static str>,
    /// Its `model_type`, which an engine that lists the families it loads
    /// (the manifest's `model_types`) must list.
    pub model_type: Option<String>,
}

/// Which layout a [`Model`] was found in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// A subfolder or model file of a model dir.
    Folder,
    /// A snapshot in the Hugging Face cache.
    HfCache {
        /// The repository, `ORG/NAME`.
        repo: String,
        /// The snapshot folder's name (a commit hash).
        revision: String,
    },
}

/// Something in a model dir that looked like a model but is not one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotAModel {
    /// The folder or file concerned.
    pub path: PathBuf,
    /// What is wrong and what to do.
    pub reason: String,
}

/// What [`discover`] found: the models, sorted by id, and the rejected
/// candidates, sorted by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Discovery {
    /// The models, sorted by id; ids are unique.
    pub models: Vec<Model>,
    /// Everything that is not a model, sorted by path.
    pub rejected: Vec<NotAModel>,
}

impl Discovery {
    /// The model called `id`.
    pub fn find(&self, id: &str) -> Option<&Model> {
        self.models
            .binary_search_by(|m| m.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.models[i])
    }
}

/// Finds the models in `model_dirs` with `rules` (the registry's
/// [`crate::registry::Registry::rules`]: built-in and plugins').
///
/// The dirs are searched in order, and each dir's entries in name order;
/// when two models share an id, the first one found wins and the later ones
/// are rejected with a reason naming the winner. A dir listed twice is read
/// once.
pub fn discover(model_dirs: &[PathBuf], rules: &[Rule]) -> Discovery {
    let mut claimed: BTreeMap<String, Model> = BTreeMap::new();
    let mut rejected = Vec::new();
    let mut seen = Vec::new();
    for dir in model_dirs {
        let dir = hub_of(dir);
        let identity = fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if seen.contains(&identity) {
            continue;
        }
        seen.push(identity);
        for found in scan(&dir, rules) {
            match found {
                Ok(model) => match claimed.get(&model.id) {
                    Some(winner) => rejected.push(NotAModel {
                        reason: format!(
                            "{} is also called '{}', and {} was found first (model dirs are \
                             searched in order, each in name order); rename or remove one of them",
                            model.path.display(),
                            model.id,
                            winner.path.display()
                        ),
                        path: model.path,
                    }),
                    None => {
                        claimed.insert(model.id.clone(), model);
                    }
                },
                Err(not) => rejected.push(not),
            }
        }
    }
    rejected.sort_by(|a, b| a.path.cmp(&b.path));
    Discovery {
        models: claimed.into_values().collect(),
        rejected,
    }
}

/// Recognises one path as [`discover`] would in a model dir: a model file,
/// a model folder, or a Hugging Face cache folder (`models--ORG--NAME`).
/// The error says why it is not a model and which rules were tried.
pub fn recognize(path: &Path, rules: &[Rule]) -> Result<Model, String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} has no file name that can be a model id", path.display()))?;
    let meta = fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.is_dir() {
        return match name.strip_prefix("models--") {
            Some(repo) => hf_model(path, repo, rules),
            None => inspect(path, rules)
                .map(|found| found.into_model(name.into(), path, ModelSource::Folder)),
        };
    }
    let Some(rule) = file_rule(name, rules) else {
        return Err(format!(
            "{} is not a model: no rule recognises the file (tried {})",
            path.display(),
            tried(rules.iter().filter(|r| r.spec.file.is_some()))
        ));
    };
    let id = path
        .file_stem()
        .map_or(name, |s| s.to_str().unwrap_or(name));
    inspect_file(path, rule).map(|found| found.into_model(id.into(), path, ModelSource::Folder))
}

/// What a folder holding files named `names` would be, by name alone: the
/// first folder rule (in [`discover`]'s order) whose patterns all match a
/// name, and the names it counts as weights. Content checks are not run, as
/// the files need not exist yet: `hangar pull` asks this of a repository's
/// file list before it downloads anything. `None` when no rule matches.
pub fn rule_for_names<'a>(names: &[String], rules: &'a [Rule]) -> Option<(&'a Rule, Vec<String>)> {
    let holds = |pattern: &String| names.iter().any(|n| name_matches(pattern, n));
    let rule = rules
        .iter()
        .filter(|r| !r.spec.folder.is_empty())
        .find(|r| r.spec.folder.iter().all(holds))?;
    let patterns = match rule.spec.weights.as_slice() {
        [] => rule.spec.folder.as_slice(),
        patterns => patterns,
    };
    let weights = names
        .iter()
        .filter(|n| patterns.iter().any(|p| name_matches(p, n)))
        .cloned()
        .collect();
    Some((rule, weights))
}

/// The rules, in words, for a reason: `gguf: *.gguf (built-in); mlx: …`.
fn tried<'a>(rules: impl Iterator<Item = &'a Rule>) -> String {
    let tried: Vec<String> = rules.map(Rule::describe).collect();
    if tried.is_empty() {
        "no rules: none declared".into()
    } else {
        tried.join("; ")
    }
}

/// The first file rule whose pattern matches the file name `name`.
fn file_rule<'a>(name: &str, rules: &'a [Rule]) -> Option<&'a Rule> {
    rules.iter().find(|r| {
        r.spec
            .file
            .as_deref()
            .is_some_and(|p| name_matches(p, name))
    })
}

/// The folder to read for model dir `dir`: its `hub/` when it is a Hugging
/// Face home, else itself.
fn hub_of(dir: &Path) -> PathBuf {
    let hub = dir.join("hub");
    if hub.is_dir() {
        hub
    } else {
        dir.to_path_buf()
    }
}

/// Every candidate in one model dir, in name order.
fn scan(dir: &Path, rules: &[Rule]) -> Vec<Result<Model, NotAModel>> {
    let reject = |path: &Path, reason: String| {
        Err(NotAModel {
            path: path.to_path_buf(),
            reason,
        })
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            return vec![reject(
                dir,
                format!(
                    "cannot read model dir {}: {e}; fix the path or remove it from model_dirs in config.toml",
                    dir.display()
                ),
            )]
        }
    };
    let mut paths = Vec::new();
    let mut found = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => paths.push(entry.path()),
            Err(e) => found.push(reject(
                dir,
                format!(
                    "cannot list every entry of model dir {}: {e}; check its permissions",
                    dir.display()
                ),
            )),
        }
    }
    paths.sort();
    for path in paths {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if name.starts_with('.') || name.starts_with("datasets--") || name.starts_with("spaces--") {
            continue;
        }
        if path.file_name().and_then(|n| n.to_str()).is_none() {
            found.push(reject(
                &path,
                format!(
                    "{} has a name that is not valid UTF-8, so it cannot be a model id; rename it",
                    path.display()
                ),
            ));
            continue;
        }
        // Following symlinks, as operators link model folders in from elsewhere.
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                found.push(reject(
                    &path,
                    format!(
                        "cannot read {}: {e}; fix the link or permissions, or remove it",
                        path.display()
                    ),
                ));
                continue;
            }
        };
        let result = if meta.is_dir() {
            match name.strip_prefix("models--") {
                Some(repo) => hf_model(&path, repo, rules),
                None => inspect(&path, rules)
                    .map(|found| found.into_model(name, &path, ModelSource::Folder)),
            }
        } else if let Some(rule) = file_rule(&name, rules) {
            let id = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            inspect_file(&path, rule)
                .map(|found| found.into_model(id.unwrap_or(name), &path, ModelSource::Folder))
        } else {
            continue;
        };
        found.push(result.or_else(|reason| reject(&path, reason)));
    }
    found
}

/// The model in Hugging Face cache folder `folder` (`models--{repo}`).
fn hf_model(folder: &Path, repo: &str, rules: &[Rule]) -> Result<Model, String> {
    if repo.is_empty() {
        return Err(format!(
            "{} is not a Hugging Face cache folder (models--ORG--NAME); rename or remove it",
            folder.display()
        ));
    }
    let repo = repo.replacen("--", "/", 1);
    let again = format!("download it again (`hf download {repo}`)");
    let snapshots = folder.join("snapshots");
    let refs_main = folder.join("refs").join("main");
    let revision = match read_capped(&refs_main, MAX_REF_BYTES) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let revision = text.trim();
            // The revision becomes a path component; it must not climb out.
            if revision.is_empty()
                || revision.contains(['/', '\\'])
                || revision == "."
                || revision == ".."
            {
                return Err(format!(
                    "{} holds '{revision}', which is not a revision; {again}",
                    refs_main.display()
                ));
            }
            if !snapshots.join(revision).is_dir() {
                return Err(format!(
                    "{} names revision {revision}, but {} is missing; the download did not finish; {again}",
                    refs_main.display(),
                    snapshots.join(revision).display()
                ));
            }
            revision.to_string()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => newest_snapshot(&snapshots, &again)?,
        Err(e) => {
            return Err(format!(
                "cannot read {}: {e}; check its permissions or {again}",
                refs_main.display()
            ))
        }
    };
    let path = snapshots.join(&revision);
    let found = inspect(&path, rules)?;
    Ok(found.into_model(repo.clone(), &path, ModelSource::HfCache { repo, revision }))
}

/// The most recently modified snapshot in `snapshots` (by name on a tie,
/// so the pick is deterministic).
fn newest_snapshot(snapshots: &Path, again: &str) -> Result<String, String> {
    let entries = fs::read_dir(snapshots).map_err(|e| {
        format!(
            "cannot read {}: {e}; the download did not finish; {again}",
            snapshots.display()
        )
    })?;
    entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let meta = fs::metadata(e.path()).ok().filter(|m| m.is_dir())?;
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            Some((modified, e.file_name().to_string_lossy().into_owned()))
        })
        .max()
        .map(|(_, name)| name)
        .ok_or_else(|| {
            format!(
                "{} holds no snapshot; the download did not finish; {again}",
                snapshots.display()
            )
        })
}

/// What a rule recognised, before it has an id.
struct Found {
    format: String,
    size_bytes: u64,
    files: Vec<String>,
    rule: String,
}

impl Found {
    fn into_model(self, id: String, path: &Path, source: ModelSource) -> Model {
        let (model_type, vision) = kind::family_of(path, &self.files);
        Model {
            kind: ModelKind::of(path, &self.files),
            model_type,
            vision,
            id,
            path: path.to_path_buf(),
            format: self.format,
            source,
            size_bytes: self.size_bytes,
            files: self.files,
            rule: self.rule,
        }
    }
}

/// A model file that `rule` matched, after its checks.
fn inspect_file(path: &Path, rule: &Rule) -> Result<Found, String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let names = [name];
    let size_bytes = checked_size(path.parent().unwrap_or(Path::new("")), &names, &names, rule)?;
    Ok(Found {
        format: rule.spec.format.clone(),
        size_bytes,
        files: names.to_vec(),
        rule: rule.describe(),
    })
}

/// The model folder `path` as the first folder rule that matches it sees
/// it, after the rule's checks; or why no rule matches, naming what an
/// almost-matching rule misses (an incomplete download) or every rule
/// tried.
fn inspect(path: &Path, rules: &[Rule]) -> Result<Found, String> {
    let mut names: Vec<String> = fs::read_dir(path)
        .map_err(|e| format!("cannot read model folder {}: {e}", path.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let holds = |pattern: &String| names.iter().any(|n| name_matches(pattern, n));
    let folder_rules = || rules.iter().filter(|r| !r.spec.folder.is_empty());
    let Some(rule) = folder_rules().find(|r| r.spec.folder.iter().all(holds)) else {
        if let Some(rule) = folder_rules().find(|r| r.spec.folder.iter().any(holds)) {
            let (has, lacks): (Vec<&String>, Vec<&String>) =
                rule.spec.folder.iter().partition(|p| holds(p));
            let list =
                |v: Vec<&String>| v.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(" + ");
            return Err(format!(
                "{} has {} but no {}, which the rule {} needs; the download may be incomplete: \
                 download the model again or copy the missing files into the folder",
                path.display(),
                list(has),
                list(lacks),
                rule.describe()
            ));
        }
        return Err(format!(
            "{} holds no model files (tried {})",
            path.display(),
            tried(folder_rules())
        ));
    };
    let matched = |patterns: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| patterns.iter().any(|p| name_matches(p, n)))
            .cloned()
            .collect()
    };
    let weights = match rule.spec.weights.as_slice() {
        [] => matched(&rule.spec.folder),
        patterns => matched(patterns),
    };
    let size_bytes = checked_size(path, &names, &weights, rule)?;
    // Subfolders are not files an engine is handed.
    let files = match rule.spec.files.as_slice() {
        [] => names.clone(),
        patterns => matched(patterns),
    };
    let files = files
        .into_iter()
        .filter(|n| !path.join(n).is_dir())
        .collect();
    Ok(Found {
        format: rule.spec.format.clone(),
        size_bytes,
        files,
        rule: rule.describe(),
    })
}

/// Runs `rule`'s content checks on the files `names` of folder `dir`, in
/// name order, and returns the summed size of `weights`.
fn checked_size(
    dir: &Path,
    names: &[String],
    weights: &[String],
    rule: &Rule,
) -> Result<u64, String> {
    for name in names {
        for (pattern, check) in &rule.spec.checks {
            if name_matches(pattern, name) {
                run_check(*check, &dir.join(name))?;
            }
        }
    }
    let mut size = 0;
    for name in weights {
        let file = dir.join(name);
        size += fs::metadata(&file)
            .map_err(|e| {
                format!(
                    "cannot read {}: {e}; the download may be incomplete, download the model again",
                    file.display()
                )
            })?
            .len();
    }
    Ok(size)
}

/// Runs one content check the engine library knows.
fn run_check(check: ContentCheck, file: &Path) -> Result<(), String> {
    match check {
        ContentCheck::Json => check_config(file),
        ContentCheck::Safetensors => check_safetensors(file).map(drop),
        ContentCheck::Gguf => check_gguf(file),
    }
}

/// Checks that a GGUF file starts with the format's magic.
fn check_gguf(file: &Path) -> Result<(), String> {
    let mut magic = [0u8; 4];
    let read = open_regular(file).and_then(|mut f| f.read_exact(&mut magic));
    match read {
        Ok(()) if &magic == b"GGUF" => Ok(()),
        Ok(()) => Err(format!(
            "{} does not start with GGUF's magic 'GGUF'; it is not a GGUF file (a Git LFS pointer?), download the model again",
            file.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(format!(
            "{} is shorter than GGUF's 4-byte magic; the download may be incomplete, download the model again",
            file.display()
        )),
        Err(e) => Err(format!(
            "cannot read {}: {e}; the download may be incomplete, download the model again",
            file.display()
        )),
    }
}

/// Checks that `config.json` is JSON.
fn check_config(file: &Path) -> Result<(), String> {
    let text = read_capped(file, MAX_CONFIG_BYTES).map_err(|e| {
        format!(
            "cannot read {}: {e}; download the model again",
            file.display()
        )
    })?;
    serde_json::from_slice::<serde::de::IgnoredAny>(&text)
        .map(drop)
        .map_err(|e| {
            format!(
                "{} is not valid JSON ({e}); fix the file or download the model again",
                file.display()
            )
        })
}

/// Checks that a safetensors file's header length fits the file, without
/// parsing the header, and returns the file's size.
///
/// A safetensors file starts with the header's length as a little-endian
/// `u64`; truncated downloads and Git LFS pointer files fail this check.
fn check_safetensors(file: &Path) -> Result<u64, String> {
    let cannot_read = |e: std::io::Error| {
        format!(
            "cannot read {}: {e}; the download may be incomplete, download the model again",
            file.display()
        )
    };
    let mut handle = open_regular(file).map_err(cannot_read)?;
    let len = handle.metadata().map_err(cannot_read)?.len();
    if len < 8 {
        return Err(format!(
            "{} is {len} bytes, too short for a safetensors file (it starts with an 8-byte header \
             length); the download may be incomplete, download the model again",
            file.display()
        ));
    }
    let mut first = [0u8; 8];
    handle.read_exact(&mut first).map_err(cannot_read)?;
    let header = u64::from_le_bytes(first);
    // The smallest header is `{}`.
    if !(2..=MAX_SAFETENSORS_HEADER.min(len - 8)).contains(&header) {
        return Err(format!(
            "{} is not a valid safetensors file: it declares a {header}-byte header but is \
             {len} bytes long; the file is truncated or not safetensors (a Git LFS pointer?), \
             download the model again",
            file.display()
        ));
    }
    Ok(len)
}

/// The built-in rules, then every plugin's, merged: rules with the same
/// signature (the same file pattern, or the same set of folder patterns)
/// and the same format become one rule declared by all of them. Rules with
/// the same signature but different formats conflict: a built-in rule is
/// kept over plugins', and between plugins the rule is dropped until they
/// agree; either way a diagnostic says so, and the plugins still load.
pub fn merge_rules<'a>(
    declared: impl IntoIterator<Item = (&'a str, &'a [hangar_plugin_api::RecognitionRule])>,
) -> (Vec<Rule>, Vec<String>) {
    let mut rules: Vec<Rule> = builtin_rules();
    for (plugin, specs) in declared {
        for spec in specs {
            match rules
                .iter_mut()
                .find(|r| r.spec.signature() == spec.signature() && r.spec.format == spec.format)
            {
                Some(same) if !same.declared_by.iter().any(|d| d == plugin) => {
                    same.declared_by.push(plugin.to_string())
                }
                Some(_) => {}
                None => rules.push(Rule {
                    spec: spec.clone(),
                    declared_by: vec![plugin.to_string()],
                }),
            }
        }
    }
    let mut conflicts = Vec::new();
    let mut kept: Vec<Rule> = Vec::new();
    for rule in &rules {
        let signature = rule.spec.signature();
        let rivals: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.spec.signature() == signature)
            .collect();
        if rivals.len() == 1 {
            kept.push(rule.clone());
            continue;
        }
        // Report each conflict once, at its first rule.
        let first = std::ptr::eq(rivals[0], rule);
        let builtin = rivals
            .iter()
            .find(|r| r.declared_by.iter().any(|d| d == BUILTIN));
        if let Some(builtin) = builtin {
            if std::ptr::eq(*builtin, rule) {
                kept.push(rule.clone());
            }
        }
        if first {
            let declarers: Vec<String> = rivals
                .iter()
                .map(|r| format!("{} → {}", r.declared_by.join(", "), r.spec.format))
                .collect();
            let outcome = match builtin {
                Some(_) => "the built-in rule is kept and the plugins' are ignored",
                None => "the rule is ignored until the plugins agree",
            };
            conflicts.push(format!(
                "recognition rule '{}' is declared for different formats ({}); {outcome}",
                rule.spec.describe(),
                declarers.join("; ")
            ));
        }
    }
    (kept, conflicts)
}

/// Opens `path` (following symlinks) for reading if it is a regular file.
///
/// FIFOs, devices and sockets are refused before they are opened: opening
/// a FIFO waits for a writer (a scan would hang), and a device such as
/// `/dev/zero` never ends. The open is non-blocking, so that a path swapped
/// for a FIFO after the check cannot hang it either.
fn open_regular(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = || std::io::Error::other("not a regular file (a FIFO, device or socket)");
    if !fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

/// The chat template(s) of a model, joined by newlines, as the engines
/// find them: `chat_template.jinja`, `chat_template.json` and
/// `tokenizer_config.json`'s `chat_template` (a string, or named templates
/// such as `default` and `tool_use`) in a folder; the
/// `tokenizer.chat_template` metadata of a GGUF file. `None` when the
/// model has none that can be read. Reads are capped like every read of a
/// model dir, and a GGUF file's metadata is walked without reading its
/// tensors.
pub fn chat_template(model: &Model) -> Option<String> {
    let mut found = Vec::new();
    if model.path.is_dir() {
        let read = |name: &str| read_capped(&model.path.join(name), MAX_CONFIG_BYTES).ok();
        if let Some(text) = read("chat_template.jinja") {
            found.push(String::from_utf8_lossy(&text).into_owned());
        }
        for name in ["chat_template.json", "tokenizer_config.json"] {
            let Some(text) = read(name) else { continue };
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) else {
                continue;
            };
            match json.get("chat_template") {
                Some(serde_json::Value::String(t)) => found.push(t.clone()),
                Some(serde_json::Value::Array(named)) => found.extend(
                    named
                        .iter()
                        .filter_map(|t| t.get("template")?.as_str().map(str::to_string)),
                ),
                _ => {}
            }
        }
        if found.is_empty() {
            let gguf = model.files.iter().find(|f| f.ends_with(".gguf"))?;
            found.extend(gguf_chat_template(&model.path.join(gguf)));
        }
    } else {
        found.extend(gguf_chat_template(&model.path));
    }
    (!found.is_empty()).then(|| found.join("\n"))
}

/// The most metadata a GGUF file is read for (its vocabulary is usually the
/// bulk: a few MiB).
const MAX_GGUF_METADATA: u64 = 256 << 20;

/// The `tokenizer.chat_template` of a GGUF file (format v2 and v3).
fn gguf_chat_template(path: &Path) -> Option<String> {
    gguf_metadata(path, |key| key == b"tokenizer.chat_template")
        .into_iter()
        .find_map(|(_, value)| match value {
            GgufValue::Text(t) => Some(t),
            GgufValue::Number(_) => None,
        })
}

/// A string or unsigned integer value of GGUF metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GgufValue {
    Text(String),
    Number(u64),
}

/// The string and unsigned integer values of a GGUF file's metadata whose
/// keys `wanted` picks, in file order, walking the metadata (capped)
/// without reading its tensors. A file that is not GGUF v2 or v3 has none;
/// one that breaks off gives what came before.
fn gguf_metadata(path: &Path, wanted: impl Fn(&[u8]) -> bool) -> Vec<(String, GgufValue)> {
    let mut found = Vec::new();
    let Ok(file) = open_regular(path) else {
        return found;
    };
    let mut r = std::io::BufReader::new(file.take(MAX_GGUF_METADATA));
    let _ = (|| {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic).ok()?;
        let version = read_u32(&mut r)?;
        if &magic != b"GGUF" || version < 2 {
            return None;
        }
        let _tensors = read_u64(&mut r)?;
        let entries = read_u64(&mut r)?;
        for _ in 0..entries.min(1 << 20) {
            let key = read_gguf_string(&mut r, 1 << 16)?;
            let kind = read_u32(&mut r)?;
            if !wanted(&key) {
                skip_gguf_value(&mut r, kind, 0)?;
                continue;
            }
            let value = match kind {
                GGUF_STRING => GgufValue::Text(
                    String::from_utf8(read_gguf_string(&mut r, MAX_CONFIG_BYTES)?).ok()?,
                ),
                // uint8, uint16, uint32, uint64.
                0 | 2 | 4 | 10 => {
                    let width = gguf_width(kind)? as usize;
                    let mut b = [0u8; 8];
                    r.read_exact(&mut b[..width]).ok()?;
                    GgufValue::Number(u64::from_le_bytes(b))
                }
                _ => {
                    skip_gguf_value(&mut r, kind, 0)?;
                    continue;
                }
            };
            found.push((String::from_utf8_lossy(&key).into_owned(), value));
        }
        Some(())
    })();
    found
}

const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;

fn read_u32(r: &mut impl Read) -> Option<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_gguf_string(r: &mut impl Read, cap: u64) -> Option<Vec<u8>> {
    let len = read_u64(r)?;
    if len > cap {
        return None;
    }
    let mut bytes = vec![0u8; len as usize];
    r.read_exact(&mut bytes).ok()?;
    Some(bytes)
}

/// The width of a GGUF scalar type, `None` for strings, arrays and
/// unknown types.
fn gguf_width(kind: u32) -> Option<u64> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Skips `len` bytes.
fn skip_bytes(r: &mut impl Read, len: u64) -> Option<()> {
    (std::io::copy(&mut r.take(len), &mut std::io::sink()).ok()? == len).then_some(())
}

/// Skips one metadata value of type `kind` (arrays nest at most a little).
fn skip_gguf_value(r: &mut impl Read, kind: u32, depth: u32) -> Option<()> {
    if let Some(width) = gguf_width(kind) {
        return skip_bytes(r, width);
    }
    match kind {
        GGUF_STRING => {
            let len = read_u64(r)?;
            skip_bytes(r, len)
        }
        GGUF_ARRAY if depth < 4 => {
            let item = read_u32(r)?;
            let count = read_u64(r)?;
            match gguf_width(item) {
                Some(width) => skip_bytes(r, count.checked_mul(width)?),
                None => (0..count).try_for_each(|_| skip_gguf_value(r, item, depth + 1)),
            }
        }
        _ => None,
    }
}

/// The contents of regular file `path` (see [`open_regular`]), refused when
/// longer than `cap` bytes.
fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::other(format!(
            "larger than {cap} bytes, more than such a file ever holds"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::time::Duration;

    use expect_test::{expect, Expect};

    use super::*;

    /// Builds `tree` in a temporary folder, discovers the models in `dirs`
    /// (relative to it) with the built-in rules and `plugins`' (plugin id,
    /// `[[recognize]]` TOML), merged as the registry merges them, and
    /// compares a compact rendering (conflicts first) with `expected`.
    ///
    /// One line of `tree` per entry, parent folders made as needed:
    /// `PATH/` is a folder, `PATH -> TARGET` a symlink, `PATH = TEXT` a file
    /// holding TEXT, `PATH = safetensors N` a valid N-byte safetensors file,
    /// `PATH = fifo` a named pipe, `PATH = sparse N` an N-byte file of
    /// zeros taking no space, and `mtime PATH SECONDS` sets a modification
    /// time. A discovery that hangs fails the test instead of hanging it.
    fn check_with(plugins: &[(&str, &str)], dirs: &[&str], tree: &str, expected: Expect) {
        #[derive(serde::Deserialize)]
        struct Declared {
            recognize: Vec<RecognitionRule>,
        }
        let declared: Vec<(&str, Vec<RecognitionRule>)> = plugins
            .iter()
            .map(|(id, text)| {
                let rules = toml::from_str::<Declared>(text).unwrap().recognize;
                for rule in &rules {
                    rule.validate().unwrap();
                }
                (*id, rules)
            })
            .collect();
        let (rules, conflicts) =
            merge_rules(declared.iter().map(|(id, rules)| (*id, rules.as_slice())));
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        build(root, tree);
        let dirs: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(discover(&dirs, &rules)));
        let discovery = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("discovery hung");
        let conflicts: String = conflicts
            .iter()
            .map(|c| format!("conflict: {c}\n"))
            .collect();
        expected.assert_eq(&(conflicts + &render(&discovery, root)));
    }

    /// [`check_with`] the built-in rules alone.
    fn check(dirs: &[&str], tree: &str, expected: Expect) {
        check_with(&[], dirs, tree, expected)
    }

    fn build(root: &Path, tree: &str) {
        for line in tree.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("mtime ") {
                let (path, secs) = rest.rsplit_once(' ').unwrap();
                let time = SystemTime::UNIX_EPOCH + Duration::from_secs(secs.parse().unwrap());
                fs::File::open(root.join(path))
                    .unwrap()
                    .set_modified(time)
                    .unwrap();
            } else if let Some(dir) = line.strip_suffix('/') {
                fs::create_dir_all(root.join(dir)).unwrap();
            } else if let Some((path, target)) = line.split_once(" -> ") {
                let path = root.join(path);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(target, path).unwrap();
            } else {
                let (path, content) = line.split_once(" = ").unwrap();
                let path = root.join(path);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                if content == "fifo" {
                    let made = std::process::Command::new("mkfifo").arg(&path).status();
                    assert!(made.unwrap().success(), "mkfifo {}", path.display());
                    continue;
                }
                if let Some(size) = content.strip_prefix("sparse ") {
                    let file = fs::File::create(&path).unwrap();
                    file.set_len(size.parse().unwrap()).unwrap();
                    continue;
                }
                let bytes = match content.strip_prefix("safetensors ") {
                    Some(size) => {
                        let header = size.parse::<usize>().unwrap() - 8;
                        let mut bytes = (header as u64).to_le_bytes().to_vec();
                        bytes.extend(format!("{:<header$}", "{}").into_bytes());
                        bytes
                    }
                    None => content.as_bytes().to_vec(),
                };
                fs::write(path, bytes).unwrap();
            }
        }
    }

    /// One line per model (`id format size source path`), then one per
    /// rejection; paths relative to `root`, OS error numbers left out so the
    /// text is the same on every Unix.
    fn render(discovery: &Discovery, root: &Path) -> String {
        let mut out = String::new();
        for m in &discovery.models {
            let source = match &m.source {
                ModelSource::Folder => "folder".to_string(),
                ModelSource::HfCache { repo, revision } => format!("hf {repo}@{revision}"),
            };
            let (id, format, size, path) = (&m.id, &m.format, m.size_bytes, m.path.display());
            writeln!(out, "{id}  {format}  {size} B  {source}  {path}").unwrap();
            writeln!(out, "  files [{}] by {}", m.files.join(", "), m.rule).unwrap();
        }
        for r in &discovery.rejected {
            writeln!(out, "rejected {}\n  {}", r.path.display(), r.reason).unwrap();
        }
        let mut out = out.replace(&format!("{}/", root.display()), "");
        while let Some(start) = out.find(" (os error ") {
            let end = start + out[start..].find(')').unwrap() + 1;
            out.replace_range(start..end, "");
        }
        out
    }

    #[test]
    fn subfolders_and_gguf_files_of_a_model_dir_are_models() {
        check(
            &["models"],
            "
            models/Qwen3-4B-4bit/config.json = {\"model_type\": \"qwen3\"}
            models/Qwen3-4B-4bit/model-00001-of-00002.safetensors = safetensors 100
            models/Qwen3-4B-4bit/model-00002-of-00002.safetensors = safetensors 50
            models/Qwen3-4B-4bit/tokenizer.json = {}
            models/llama-gguf/llama.Q4_K_M.gguf = GGUF....
            models/tiny.gguf = GGUF
            models/README.md = not a model, ignored
            models/.cache/
            models/.hidden.gguf = GGUF
            ",
            expect![[r#"
                Qwen3-4B-4bit  mlx  150 B  folder  models/Qwen3-4B-4bit
                  files [config.json, model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, tokenizer.json] by mlx: a folder of config.json + *.safetensors (built-in)
                llama-gguf  gguf  8 B  folder  models/llama-gguf
                  files [llama.Q4_K_M.gguf] by gguf: a folder of *.gguf (built-in)
                tiny  gguf  4 B  folder  models/tiny.gguf
                  files [tiny.gguf] by gguf: *.gguf (built-in)
            "#]],
        );
    }

    #[test]
    fn a_symlinked_model_folder_is_followed() {
        check(
            &["models"],
            "
            elsewhere/phi/config.json = {}
            elsewhere/phi/model.safetensors = safetensors 20
            models/phi -> ../elsewhere/phi
            ",
            expect![[r#"
                phi  mlx  20 B  folder  models/phi
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
            "#]],
        );
    }

    #[test]
    fn the_hf_cache_takes_the_revision_refs_main_names() {
        // `refs/main` points at the older snapshot; files are links into blobs/.
        check(
            &["huggingface"],
            "
            huggingface/token = secret
            huggingface/xet/
            huggingface/hub/version.txt = 1
            huggingface/hub/.locks/models--mlx-community--Qwen3-4B/
            huggingface/hub/datasets--org--data/snapshots/abc/data.json = {}
            huggingface/hub/spaces--org--demo/
            huggingface/hub/models--mlx-community--Qwen3-4B/blobs/c0ffee = {}
            huggingface/hub/models--mlx-community--Qwen3-4B/blobs/beef = safetensors 64
            huggingface/hub/models--mlx-community--Qwen3-4B/blobs/f00d = safetensors 99
            huggingface/hub/models--mlx-community--Qwen3-4B/refs/main = 1111
            huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/1111/config.json -> ../../blobs/c0ffee
            huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/1111/model.safetensors -> ../../blobs/beef
            huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/2222/config.json -> ../../blobs/c0ffee
            huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/2222/model.safetensors -> ../../blobs/f00d
            mtime huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/1111 1000
            mtime huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/2222 2000
            huggingface/hub/models--gpt2/blobs/aa = GGUF-weights
            huggingface/hub/models--gpt2/snapshots/9/gpt2.gguf -> ../../blobs/aa
            ",
            expect![[r#"
                gpt2  gguf  12 B  hf gpt2@9  huggingface/hub/models--gpt2/snapshots/9
                  files [gpt2.gguf] by gguf: a folder of *.gguf (built-in)
                mlx-community/Qwen3-4B  mlx  64 B  hf mlx-community/Qwen3-4B@1111  huggingface/hub/models--mlx-community--Qwen3-4B/snapshots/1111
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
            "#]],
        );
    }

    #[test]
    fn without_refs_main_the_newest_snapshot_is_taken() {
        let tree = "
            hub/models--org--m/snapshots/aaaa/config.json = {}
            hub/models--org--m/snapshots/aaaa/model.safetensors = safetensors 10
            hub/models--org--m/snapshots/bbbb/config.json = {}
            hub/models--org--m/snapshots/bbbb/model.safetensors = safetensors 20
            mtime hub/models--org--m/snapshots/aaaa AAAA
            mtime hub/models--org--m/snapshots/bbbb BBBB
        ";
        check(
            &["hub"],
            &tree.replace("AAAA", "2000").replace("BBBB", "1000"),
            expect![[r#"
                org/m  mlx  10 B  hf org/m@aaaa  hub/models--org--m/snapshots/aaaa
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
            "#]],
        );
        check(
            &["hub"],
            &tree.replace("AAAA", "1000").replace("BBBB", "2000"),
            expect![[r#"
                org/m  mlx  20 B  hf org/m@bbbb  hub/models--org--m/snapshots/bbbb
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
            "#]],
        );
    }

    #[test]
    fn broken_hf_cache_entries_are_rejected() {
        check(
            &["hub"],
            "
            hub/models--org--no-snapshots/blobs/
            hub/models--org--empty-snapshots/snapshots/
            hub/models--org--dangling-ref/refs/main = 3333
            hub/models--org--dangling-ref/snapshots/1111/model.gguf = GGUF
            hub/models--org--escaping-ref/refs/main = ../../../etc
            hub/models--org--missing-blob/refs/main = 1111
            hub/models--org--missing-blob/snapshots/1111/config.json = {}
            hub/models--org--missing-blob/snapshots/1111/model.safetensors -> ../../blobs/gone
            hub/models--/
            ",
            expect![[r#"
                rejected hub/models--
                  hub/models-- is not a Hugging Face cache folder (models--ORG--NAME); rename or remove it
                rejected hub/models--org--dangling-ref
                  hub/models--org--dangling-ref/refs/main names revision 3333, but hub/models--org--dangling-ref/snapshots/3333 is missing; the download did not finish; download it again (`hf download org/dangling-ref`)
                rejected hub/models--org--empty-snapshots
                  hub/models--org--empty-snapshots/snapshots holds no snapshot; the download did not finish; download it again (`hf download org/empty-snapshots`)
                rejected hub/models--org--escaping-ref
                  hub/models--org--escaping-ref/refs/main holds '../../../etc', which is not a revision; download it again (`hf download org/escaping-ref`)
                rejected hub/models--org--missing-blob
                  cannot read hub/models--org--missing-blob/snapshots/1111/model.safetensors: No such file or directory; the download may be incomplete, download the model again
                rejected hub/models--org--no-snapshots
                  cannot read hub/models--org--no-snapshots/snapshots: No such file or directory; the download did not finish; download it again (`hf download org/no-snapshots`)
            "#]],
        );
    }

    #[test]
    fn incomplete_model_folders_say_what_is_missing() {
        check(
            &["models"],
            "
            models/good/config.json = {}
            models/good/model.safetensors = safetensors 16
            models/no-config/model.safetensors = safetensors 16
            models/no-weights/config.json = {}
            models/empty/
            models/notes.txt.gguf/
            ",
            expect![[r#"
                good  mlx  16 B  folder  models/good
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
                rejected models/empty
                  models/empty holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in))
                rejected models/no-config
                  models/no-config has *.safetensors but no config.json, which the rule mlx: a folder of config.json + *.safetensors (built-in) needs; the download may be incomplete: download the model again or copy the missing files into the folder
                rejected models/no-weights
                  models/no-weights has config.json but no *.safetensors, which the rule mlx: a folder of config.json + *.safetensors (built-in) needs; the download may be incomplete: download the model again or copy the missing files into the folder
                rejected models/notes.txt.gguf
                  models/notes.txt.gguf holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in))
            "#]],
        );
    }

    #[test]
    fn an_invalid_config_json_is_rejected_with_its_line_and_column() {
        check(
            &["models"],
            "
            models/truncated/config.json = {\"model_type\": \"qwen3\",
            models/truncated/model.safetensors = safetensors 16
            models/html/config.json = <html>rate limited</html>
            models/html/model.safetensors = safetensors 16
            ",
            expect![[r#"
                rejected models/html
                  models/html/config.json is not valid JSON (expected value at line 1 column 1); fix the file or download the model again
                rejected models/truncated
                  models/truncated/config.json is not valid JSON (EOF while parsing an object at line 1 column 23); fix the file or download the model again
            "#]],
        );
    }

    #[test]
    fn impossible_safetensors_headers_are_rejected() {
        check(
            &["models"],
            "
            models/short/config.json = {}
            models/short/model.safetensors = 1234567
            models/truncated/config.json = {}
            models/truncated/model.safetensors = \x10\x00\x00\x00\x00\x00\x00\x00{}
            models/lfs-pointer/config.json = {}
            models/lfs-pointer/model.safetensors = version https://git-lfs.github.com/spec/v1
            models/zero-header/config.json = {}
            models/zero-header/model.safetensors = \x00\x00\x00\x00\x00\x00\x00\x00{}
            models/one-bad-shard/config.json = {}
            models/one-bad-shard/a.safetensors = safetensors 16
            models/one-bad-shard/b.safetensors = tiny
            ",
            expect![[r#"
                rejected models/lfs-pointer
                  models/lfs-pointer/model.safetensors is not a valid safetensors file: it declares a 2336927755350992246-byte header but is 42 bytes long; the file is truncated or not safetensors (a Git LFS pointer?), download the model again
                rejected models/one-bad-shard
                  models/one-bad-shard/b.safetensors is 4 bytes, too short for a safetensors file (it starts with an 8-byte header length); the download may be incomplete, download the model again
                rejected models/short
                  models/short/model.safetensors is 7 bytes, too short for a safetensors file (it starts with an 8-byte header length); the download may be incomplete, download the model again
                rejected models/truncated
                  models/truncated/model.safetensors is not a valid safetensors file: it declares a 16-byte header but is 10 bytes long; the file is truncated or not safetensors (a Git LFS pointer?), download the model again
                rejected models/zero-header
                  models/zero-header/model.safetensors is not a valid safetensors file: it declares a 0-byte header but is 10 bytes long; the file is truncated or not safetensors (a Git LFS pointer?), download the model again
            "#]],
        );
    }

    #[test]
    fn unreadable_entries_and_model_dirs_are_rejected() {
        check(
            &["models", "missing"],
            "
            models/ok.gguf = GGUF
            models/loop -> loop
            models/dangling -> nowhere
            models/dangling.gguf -> nowhere.gguf
            ",
            expect![[r#"
                ok  gguf  4 B  folder  models/ok.gguf
                  files [ok.gguf] by gguf: *.gguf (built-in)
                rejected missing
                  cannot read model dir missing: No such file or directory; fix the path or remove it from model_dirs in config.toml
                rejected models/dangling
                  cannot read models/dangling: No such file or directory; fix the link or permissions, or remove it
                rejected models/dangling.gguf
                  cannot read models/dangling.gguf: No such file or directory; fix the link or permissions, or remove it
                rejected models/loop
                  cannot read models/loop: Too many levels of symbolic links; fix the link or permissions, or remove it
            "#]],
        );
    }

    #[test]
    fn on_duplicate_ids_the_first_model_dir_wins() {
        check(
            &["first", "second", "hf", "first"],
            "
            first/qwen/config.json = {}
            first/qwen/model.safetensors = safetensors 10
            first/llama/model.gguf = GGUF
            first/llama.gguf = GGUF
            first/broken/
            second/qwen.gguf = GGUF
            second/broken.gguf = GGUF
            hf/hub/models--qwen/snapshots/1/q.gguf = GGUF
            ",
            expect![[r#"
                broken  gguf  4 B  folder  second/broken.gguf
                  files [broken.gguf] by gguf: *.gguf (built-in)
                llama  gguf  4 B  folder  first/llama
                  files [model.gguf] by gguf: a folder of *.gguf (built-in)
                qwen  mlx  10 B  folder  first/qwen
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
                rejected first/broken
                  first/broken holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in))
                rejected first/llama.gguf
                  first/llama.gguf is also called 'llama', and first/llama was found first (model dirs are searched in order, each in name order); rename or remove one of them
                rejected hf/hub/models--qwen/snapshots/1
                  hf/hub/models--qwen/snapshots/1 is also called 'qwen', and first/qwen was found first (model dirs are searched in order, each in name order); rename or remove one of them
                rejected second/qwen.gguf
                  second/qwen.gguf is also called 'qwen', and first/qwen was found first (model dirs are searched in order, each in name order); rename or remove one of them
            "#]],
        );
    }

    #[test]
    fn a_fifo_or_device_in_a_model_folder_is_refused_without_opening_it() {
        // Regressions: a FIFO named config.json blocked the host's start (the
        // scan waited for a writer), and a config.json linked to /dev/zero
        // grew the host by 2 GB per scan.
        check(
            &["models", "hub"],
            "
            models/fifo-config/config.json = fifo
            models/fifo-config/model.safetensors = safetensors 16
            models/zero-config/config.json -> /dev/zero
            models/zero-config/model.safetensors = safetensors 16
            models/fifo-weights/config.json = {}
            models/fifo-weights/model.safetensors = fifo
            models/ok/config.json = {}
            models/ok/model.safetensors = safetensors 16
            hub/models--org--fifo-ref/refs/main = fifo
            hub/models--org--fifo-ref/snapshots/1/m.gguf = GGUF
            ",
            expect![[r#"
                ok  mlx  16 B  folder  models/ok
                  files [config.json, model.safetensors] by mlx: a folder of config.json + *.safetensors (built-in)
                rejected hub/models--org--fifo-ref
                  cannot read hub/models--org--fifo-ref/refs/main: not a regular file (a FIFO, device or socket); check its permissions or download it again (`hf download org/fifo-ref`)
                rejected models/fifo-config
                  cannot read models/fifo-config/config.json: not a regular file (a FIFO, device or socket); download the model again
                rejected models/fifo-weights
                  cannot read models/fifo-weights/model.safetensors: not a regular file (a FIFO, device or socket); the download may be incomplete, download the model again
                rejected models/zero-config
                  cannot read models/zero-config/config.json: not a regular file (a FIFO, device or socket); download the model again
            "#]],
        );
    }

    #[test]
    fn a_config_json_past_the_cap_is_refused_unread() {
        check(
            &["models"],
            "
            models/huge/config.json = sparse 16777217
            models/huge/model.safetensors = safetensors 16
            models/at-cap/config.json = sparse 16777216
            models/at-cap/model.safetensors = safetensors 16
            ",
            expect![[r#"
                rejected models/at-cap
                  models/at-cap/config.json is not valid JSON (expected value at line 1 column 1); fix the file or download the model again
                rejected models/huge
                  cannot read models/huge/config.json: larger than 16777216 bytes, more than such a file ever holds; download the model again
            "#]],
        );
    }

    #[test]
    fn find_looks_models_up_by_id() {
        let temp = tempfile::tempdir().unwrap();
        build(
            temp.path(),
            "
            models/b.gguf = GGUF
            models/a.gguf = GGUF
            hub/models--org--c/snapshots/1/c.gguf = GGUF
            ",
        );
        let dirs = [temp.path().join("models"), temp.path().join("hub")];
        let discovery = discover(&dirs, &builtin_rules());
        let found = |id| discovery.find(id).map(|m| m.id.as_str());
        assert_eq!(found("a"), Some("a"));
        assert_eq!(found("org/c"), Some("org/c"));
        assert_eq!(found("c"), None);
        assert_eq!(found("z"), None);
    }

    #[test]
    fn the_builtin_rules_are_valid_declarations() {
        for rule in builtin_rules() {
            rule.spec.validate().unwrap();
        }
    }

    #[test]
    fn gguf_files_must_start_with_the_magic() {
        check(
            &["models"],
            "
            models/good.gguf = GGUF weights
            models/pointer.gguf = version https://git-lfs.github.com/spec/v1
            models/short.gguf = GG
            models/folder/model.gguf = ggml
            ",
            expect![[r#"
                good  gguf  12 B  folder  models/good.gguf
                  files [good.gguf] by gguf: *.gguf (built-in)
                rejected models/folder
                  models/folder/model.gguf does not start with GGUF's magic 'GGUF'; it is not a GGUF file (a Git LFS pointer?), download the model again
                rejected models/pointer.gguf
                  models/pointer.gguf does not start with GGUF's magic 'GGUF'; it is not a GGUF file (a Git LFS pointer?), download the model again
                rejected models/short.gguf
                  models/short.gguf is shorter than GGUF's 4-byte magic; the download may be incomplete, download the model again
            "#]],
        );
    }

    const TOY: &str = r#"
        [[recognize]]
        format = "toy"
        file = "*.toy"

        [[recognize]]
        format = "toy"
        folder = ["*.toy", "vocab.txt"]
        files = ["*.toy", "vocab.txt"]
        checks = { "vocab.txt" = "json" }
    "#;

    #[test]
    fn plugins_teach_formats_by_file_pattern_and_folder_signature() {
        check_with(
            &[("toy-plugin", TOY)],
            &["models"],
            "
            models/hello.toy = TOY1 hello
            models/shelf/a.toy = TOY1 a
            models/shelf/vocab.txt = [\"a\"]
            models/shelf/notes.md = not needed by the engine
            models/shelf/sub/
            models/half/a.toy = TOY1 a
            models/bad-vocab/b.toy = TOY1 b
            models/bad-vocab/vocab.txt = not json
            models/notes.txt = not a model, skipped
            models/empty/
            ",
            expect![[r#"
                hello  toy  10 B  folder  models/hello.toy
                  files [hello.toy] by toy: *.toy (toy-plugin)
                shelf  toy  11 B  folder  models/shelf
                  files [a.toy, vocab.txt] by toy: a folder of *.toy + vocab.txt (toy-plugin)
                rejected models/bad-vocab
                  models/bad-vocab/vocab.txt is not valid JSON (expected ident at line 1 column 2); fix the file or download the model again
                rejected models/empty
                  models/empty holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in); toy: a folder of *.toy + vocab.txt (toy-plugin))
                rejected models/half
                  models/half has *.toy but no vocab.txt, which the rule toy: a folder of *.toy + vocab.txt (toy-plugin) needs; the download may be incomplete: download the model again or copy the missing files into the folder
            "#]],
        );
    }

    #[test]
    fn conflicting_rules_are_reported_and_the_rest_still_recognise() {
        let same_as_builtin = r#"
            [[recognize]]
            format = "gguf"
            file = "*.gguf"
        "#;
        let steals_gguf = r#"
            [[recognize]]
            format = "ggml"
            file = "*.gguf"
        "#;
        let other_toy = r#"
            [[recognize]]
            format = "toy2"
            folder = ["vocab.txt", "*.toy"]
        "#;
        check_with(
            &[
                ("llama", same_as_builtin),
                ("thief", steals_gguf),
                ("toy-plugin", TOY),
                ("toy-two", other_toy),
            ],
            &["models"],
            "
            models/tiny.gguf = GGUF
            models/hello.toy = TOY1 hello
            models/shelf/a.toy = TOY1 a
            models/shelf/vocab.txt = []
            ",
            expect![[r#"
                conflict: recognition rule '*.gguf' is declared for different formats (built-in, llama → gguf; thief → ggml); the built-in rule is kept and the plugins' are ignored
                conflict: recognition rule 'a folder of *.toy + vocab.txt' is declared for different formats (toy-plugin → toy; toy-two → toy2); the rule is ignored until the plugins agree
                hello  toy  10 B  folder  models/hello.toy
                  files [hello.toy] by toy: *.toy (toy-plugin)
                tiny  gguf  4 B  folder  models/tiny.gguf
                  files [tiny.gguf] by gguf: *.gguf (built-in, llama)
                rejected models/shelf
                  models/shelf holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in))
            "#]],
        );
    }

    #[test]
    fn recognize_says_which_rules_were_tried() {
        let temp = tempfile::tempdir().unwrap();
        build(temp.path(), "notes.txt = hi\nhello.toy = TOY1\n");
        let rules = builtin_rules();
        let error = recognize(&temp.path().join("notes.txt"), &rules).unwrap_err();
        let error = error.replace(&temp.path().display().to_string(), "$TMP");
        expect!["$TMP/notes.txt is not a model: no rule recognises the file (tried gguf: *.gguf (built-in))"].assert_eq(&error);
        let error = recognize(temp.path(), &rules).unwrap_err();
        let error = error.replace(&temp.path().display().to_string(), "$TMP");
        expect!["$TMP holds no model files (tried gguf: a folder of *.gguf (built-in); mlx: a folder of config.json + *.safetensors (built-in))"].assert_eq(&error);
    }
}
