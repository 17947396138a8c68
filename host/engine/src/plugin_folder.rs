//! Plugin folders: a `plugin.toml` beside its artifact, taken as they are
//! or assembled from a plugin crate's `cargo build`.
//!
//! A plugin author works in a crate folder (`Cargo.toml`, `plugin.toml`,
//! `src/`), while the host reads plugin folders (`plugin.toml` and the
//! built library, nothing else). `hangar plugin check`, `hangar plugin
//! pack` and the test kit's `PluginTest::build` accept either: a crate is
//! built with cargo, which names the library it wrote, and the library is
//! copied beside a copy of the manifest in a scratch folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hangar_plugin_api::manifest::MANIFEST_FILE;
use hangar_plugin_api::{Manifest, PluginKind};
use tempfile::TempDir;

/// A plugin folder, kept alive for as long as this value lives when it was
/// assembled in a scratch folder.
#[derive(Debug)]
pub struct PluginFolder {
    path: PathBuf,
    scratch: Option<TempDir>,
}

/// Which cargo profile builds a plugin crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `cargo build`: what a plugin's own `cargo test` uses.
    Dev,
    /// `cargo build --release`: what ships.
    Release,
}

impl PluginFolder {
    /// The folder holding `plugin.toml` and the artifact.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the folder was assembled from a crate's build.
    pub fn assembled(&self) -> bool {
        self.scratch.is_some()
    }

    /// The plugin folder `dir`, as it is.
    pub fn existing(dir: &Path) -> PluginFolder {
        PluginFolder {
            path: dir.to_path_buf(),
            scratch: None,
        }
    }

    /// `dir` as a plugin folder: `dir` itself when it holds its artifact;
    /// otherwise, when it is a crate (`Cargo.toml` beside `plugin.toml`),
    /// the crate built with `profile` and assembled into a scratch folder.
    ///
    /// `kind` builds a crate as that kind of plugin whatever its
    /// `plugin.toml` says (one source can be a native and a WebAssembly
    /// plugin); the assembled `plugin.toml` then says `kind = "…"` too. A
    /// built folder is one kind: asking it for the other is an error.
    pub fn open(
        dir: &Path,
        profile: Profile,
        kind: Option<PluginKind>,
    ) -> Result<PluginFolder, String> {
        let declared = Manifest::from_dir(dir).ok().map(|m| m.kind);
        let other_kind = kind.is_some() && kind != declared;
        if is_crate(dir) && (other_kind || !artifact_present(dir)) {
            return PluginFolder::build(dir, profile, kind);
        }
        match (kind, declared) {
            (Some(kind), Some(declared)) if kind != declared => Err(format!(
                "{} is a built {declared} plugin folder; to check or pack the {kind} plugin, give the crate's folder with --kind {kind}",
                dir.display()
            )),
            _ => Ok(PluginFolder::existing(dir)),
        }
    }

    /// Builds the plugin crate in `crate_dir` with cargo, as `kind` (default:
    /// its `plugin.toml`'s), and assembles its plugin folder (the crate's
    /// `plugin.toml` and the library cargo built) in a scratch folder.
    pub fn build(
        crate_dir: &Path,
        profile: Profile,
        kind: Option<PluginKind>,
    ) -> Result<PluginFolder, String> {
        let manifest_path = crate_dir.join(MANIFEST_FILE);
        let mut manifest = Manifest::from_dir(crate_dir)
            .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
        let declared = manifest.kind;
        manifest.kind = kind.unwrap_or(declared);
        let library = cargo_build(crate_dir, manifest.kind, profile)?;
        let wanted = manifest.artifact_file_name();
        let built = library
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if built != wanted {
            return Err(format!(
                "plugin.toml names the artifact '{}' ({wanted} on this platform), but cargo built {built}; set artifact to the crate's library name",
                manifest.artifact
            ));
        }
        let scratch = tempfile::Builder::new()
            .prefix("hangar-plugin-")
            .tempdir()
            .map_err(|e| format!("cannot create a scratch folder: {e}"))?;
        let path = scratch.path().join(&manifest.id);
        let copy = |from: &Path, name: &str| {
            std::fs::copy(from, path.join(name))
                .map(drop)
                .map_err(|e| format!("cannot copy {}: {e}", from.display()))
        };
        std::fs::create_dir(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        if manifest.kind == declared {
            copy(&manifest_path, MANIFEST_FILE)?;
        } else {
            let text = with_kind(&manifest_path, manifest.kind)?;
            let to = path.join(MANIFEST_FILE);
            std::fs::write(&to, text).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
        }
        copy(&library, &wanted)?;
        // The conformance fixture lives in the crate; the suite reports it
        // when it is missing.
        if let Some(fixture) = &manifest.conformance.fixture {
            let from = crate_dir.join(fixture);
            if from.exists() {
                copy_tree(&from, &path.join(fixture))?;
            }
        }
        Ok(PluginFolder {
            path,
            scratch: Some(scratch),
        })
    }
}

/// Copies the file or folder `from` to `to`, making parent folders.
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot copy {}: {e}", from.display());
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    if !from.is_dir() {
        return std::fs::copy(from, to).map(drop).map_err(fail);
    }
    std::fs::create_dir_all(to).map_err(fail)?;
    for entry in std::fs::read_dir(from).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        copy_tree(&entry.path(), &to.join(entry.file_name()))?;
    }
    Ok(())
}

/// The text of the manifest at `path` with `kind` set, comments kept.
fn with_kind(path: &Path, kind: PluginKind) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    doc["kind"] = toml_edit::value(kind.to_string());
    Ok(doc.to_string())
}

fn is_crate(dir: &Path) -> bool {
    dir.join("Cargo.toml").is_file() && dir.join(MANIFEST_FILE).is_file()
}

fn artifact_present(dir: &Path) -> bool {
    Manifest::from_dir(dir).is_ok_and(|m| dir.join(m.artifact_file_name()).is_file())
}

/// The target WebAssembly plugins are built for.
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Runs `cargo build --lib` for the crate in `crate_dir` (for
/// [`WASM_TARGET`] when the plugin is WebAssembly) and returns the library
/// it produced, as cargo reports it (so the target dir, `CARGO_TARGET_DIR`
/// and the profile are cargo's business, not ours).
fn cargo_build(crate_dir: &Path, kind: PluginKind, profile: Profile) -> Result<PathBuf, String> {
    let manifest_path = crate_dir.join("Cargo.toml");
    let manifest_path = manifest_path
        .canonicalize()
        .map_err(|e| format!("cannot read {}: {e}", manifest_path.display()))?;
    // Inside `cargo test`, CARGO names the cargo that runs the tests.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--quiet",
            "--lib",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(&manifest_path);
    if profile == Profile::Release {
        command.arg("--release");
    }
    if kind == PluginKind::Wasm {
        command.args(["--target", WASM_TARGET]);
    }
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo (is it installed and on PATH?): {e}"))?;
    if !output.status.success() {
        let hint = match kind {
            PluginKind::Wasm => format!(
                "; a WebAssembly plugin needs the target once: rustup target add {WASM_TARGET}"
            ),
            PluginKind::Native => String::new(),
        };
        return Err(format!(
            "cargo build of {} failed (its errors are above){hint}",
            manifest_path.display()
        ));
    }
    let suffix = match kind {
        PluginKind::Native => std::env::consts::DLL_SUFFIX,
        PluginKind::Wasm => ".wasm",
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        // Cargo may name the crate by another spelling of the same path
        // (a symlinked temp dir on macOS).
        .filter(|m| {
            m["manifest_path"]
                .as_str()
                .and_then(|p| Path::new(p).canonicalize().ok())
                .as_ref()
                == Some(&manifest_path)
        })
        .filter_map(|m| m["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.to_string_lossy().ends_with(suffix))
        .ok_or_else(|| {
            format!(
                "cargo built no library for {}; a plugin sets crate-type = [\"cdylib\"] under [lib]",
                manifest_path.display()
            )
        })
}
