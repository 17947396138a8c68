//! One-file plugin distributables: `hangar plugin pack` writes one,
//! `hangar plugin install` checks and unpacks one into a plugins dir.
//!
//! A package is a gzip-compressed tar holding one folder named after the
//! plugin id; `pack` writes three files into it:
//!
//! ```text
//! demo/plugin.toml
//! demo/libhangar_plugin_demo.so
//! demo/SHA256SUMS          sha256sum's format: "<hex>  <file>" per line
//! ```
//!
//! Packing is deterministic (sorted entries, zero timestamps and owners),
//! so the same folder always packs to the same bytes. The checksums guard
//! against a damaged or tampered download, not against a malicious
//! author: the package is as trustworthy as where it came from.
//!
//! Installing takes any plain files directly inside the one folder that
//! the checksums list, and refuses anything else (links, `..`, absolute
//! paths, subfolders), files the checksums do not list or that do not match, a manifest the host would refuse, a
//! native library built for another machine or a WebAssembly file that is not
//! a plugin of the host's world, and an id that is already
//! installed (unless forced). It unpacks into a staging folder and renames
//! it into place, so a running host never sees half a plugin, and a
//! replaced library is unlinked rather than overwritten while mapped.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use hangar_plugin_api::manifest::MANIFEST_FILE;
use hangar_plugin_api::{Manifest, ManifestError, PluginKind};
use sha2::{Digest, Sha256};

/// The checksum file inside a package.
pub const CHECKSUMS_FILE: &str = "SHA256SUMS";

/// The largest package contents `install` accepts (uncompressed).
const MAX_UNPACKED: u64 = 1 << 30;

/// Why a package could not be written or installed.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`cannot read`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The plugin's manifest would be refused by the host.
    #[error("{}: {source}", path.display())]
    Manifest {
        /// Where the manifest came from.
        path: PathBuf,
        /// Why it is refused.
        source: ManifestError,
    },
    /// The folder or package is not what a plugin package must be.
    #[error("{0}")]
    Refused(String),
    /// A plugin with this id is installed already.
    #[error("plugin '{id}' is already installed in {}; pass --force to replace it", path.display())]
    Installed {
        /// The plugin id.
        id: String,
        /// Its folder.
        path: PathBuf,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PackageError {
    let path = path.to_path_buf();
    move |source| PackageError::Io { what, path, source }
}

/// The file name `pack` gives a plugin's package by default:
/// `ID-VERSION-OS-ARCH.tar.gz`, or `ID-VERSION-wasm.tar.gz` for a
/// WebAssembly plugin, which runs everywhere.
pub fn default_file_name(manifest: &Manifest) -> String {
    if manifest.kind == PluginKind::Wasm {
        return format!("{}-{}-wasm.tar.gz", manifest.id, manifest.version);
    }
    format!(
        "{}-{}-{}-{}.tar.gz",
        manifest.id,
        manifest.version,
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Packs the plugin folder `dir` (its `plugin.toml` and artifact) into
/// `out`. Returns the manifest packed.
pub fn pack(dir: &Path, out: &Path) -> Result<Manifest, PackageError> {
    let manifest = Manifest::from_dir(dir).map_err(|source| PackageError::Manifest {
        path: dir.join(MANIFEST_FILE),
        source,
    })?;
    let artifact = manifest.artifact_file_name();
    if !dir.join(&artifact).is_file() {
        return Err(PackageError::Refused(format!(
            "{} has no {artifact}; build the plugin first (or pack its crate folder, which builds it)",
            dir.display()
        )));
    }
    let mut files = BTreeMap::new();
    for name in [MANIFEST_FILE, artifact.as_str()] {
        let path = dir.join(name);
        files.insert(
            name.to_string(),
            std::fs::read(&path).map_err(io("cannot read", &path))?,
        );
    }
    let sums: String = files
        .iter()
        .map(|(name, bytes)| format!("{}  {name}\n", sha256(bytes)))
        .collect();
    files.insert(CHECKSUMS_FILE.into(), sums.into_bytes());

    let file = std::fs::File::create(out).map_err(io("cannot create", out))?;
    let gz = GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    for (name, bytes) in &files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(
            &mut header,
            format!("{}/{name}", manifest.id),
            bytes.as_slice(),
        )
        .map_err(io("cannot write", out))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .map_err(io("cannot write", out))?;
    Ok(manifest)
}

/// What `install` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Installed {
    /// The plugin id.
    pub id: String,
    /// The plugin's version.
    pub version: String,
    /// The plugin folder written.
    pub dir: PathBuf,
    /// Whether an installed plugin of the same id was replaced.
    pub replaced: bool,
}

/// Checks the package `file` and unpacks it into `plugins_dir/ID`.
/// `approve` sees the checked manifest before anything is written (the
/// command line lists the programs the plugin may run and asks); its error
/// cancels the installation.
pub fn install(
    file: &Path,
    plugins_dir: &Path,
    force: bool,
    approve: impl FnOnce(&Manifest) -> Result<(), String>,
) -> Result<Installed, PackageError> {
    let (id, files) = read_package(file)?;
    let refused = |reason: String| PackageError::Refused(format!("{}: {reason}", file.display()));
    let sums = files
        .get(CHECKSUMS_FILE)
        .ok_or_else(|| refused(format!("the package has no {CHECKSUMS_FILE}")))?;
    verify_checksums(&files, sums).map_err(refused)?;
    let text = files
        .get(MANIFEST_FILE)
        .ok_or_else(|| refused(format!("the package has no {MANIFEST_FILE}")))?;
    let manifest = std::str::from_utf8(text)
        .map_err(|_| ManifestError::Malformed("the file is not UTF-8".into()))
        .and_then(Manifest::parse)
        .map_err(|source| PackageError::Manifest {
            path: file.join(&id).join(MANIFEST_FILE),
            source,
        })?;
    if manifest.id != id {
        return Err(refused(format!(
            "its folder is '{id}' but its plugin.toml says id '{}'",
            manifest.id
        )));
    }
    let artifact = manifest.artifact_file_name();
    if !files.contains_key(&artifact) {
        return Err(refused(format!(
            "plugin.toml names the artifact {artifact}, which the package lacks (it was packed on another platform?)"
        )));
    }
    approve(&manifest).map_err(PackageError::Refused)?;

    std::fs::create_dir_all(plugins_dir).map_err(io("cannot create", plugins_dir))?;
    let target = plugins_dir.join(&id);
    if let Some(other) = installed_elsewhere(plugins_dir, &id, &target) {
        return Err(PackageError::Refused(format!(
            "plugin '{id}' is already installed in {}; remove that folder first",
            other.display()
        )));
    }
    let exists = target.exists();
    if exists && !force {
        return Err(PackageError::Installed { id, path: target });
    }

    let staging = tempfile::Builder::new()
        .prefix(&format!(".{id}.installing-"))
        .tempdir_in(plugins_dir)
        .map_err(io("cannot create a staging folder in", plugins_dir))?;
    for (name, bytes) in &files {
        let path = staging.path().join(name);
        std::fs::write(&path, bytes).map_err(io("cannot write", &path))?;
    }
    let staged_artifact = staging.path().join(&artifact);
    match manifest.kind {
        PluginKind::Native => {
            hangar_engine::loader::native::check_object(&staged_artifact).map_err(refused)?
        }
        // Compiling it checks it is a plugin of this host's world, and
        // fills the compile cache for the host's first start.
        PluginKind::Wasm => hangar_engine::loader::wasm::WasmPlugin::load(&staged_artifact)
            .map(drop)
            .map_err(refused)?,
    }
    let staged = staging.keep();
    let old = plugins_dir.join(format!(".{id}.replaced-{}", std::process::id()));
    if exists {
        std::fs::rename(&target, &old).map_err(io("cannot move aside", &target))?;
    }
    std::fs::rename(&staged, &target).map_err(io("cannot move into place", &target))?;
    if exists {
        std::fs::remove_dir_all(&old).map_err(io("cannot remove", &old))?;
    }
    Ok(Installed {
        id,
        version: manifest.version.to_string(),
        dir: target,
        replaced: exists,
    })
}

/// Reads every entry of the package: one top folder, plain files directly
/// inside it. Returns the folder name and the files by name.
fn read_package(file: &Path) -> Result<(String, BTreeMap<String, Vec<u8>>), PackageError> {
    let refused = |reason: String| PackageError::Refused(format!("{}: {reason}", file.display()));
    let not_a_package = |e: std::io::Error| {
        refused(format!(
            "not a plugin package (a .tar.gz written by `hangar plugin pack`): {e}"
        ))
    };
    let reader = std::fs::File::open(file).map_err(io("cannot open", file))?;
    let mut archive = tar::Archive::new(GzDecoder::new(reader));
    let mut top: Option<String> = None;
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for entry in archive.entries().map_err(not_a_package)? {
        let mut entry = entry.map_err(not_a_package)?;
        let path = entry.path().map_err(not_a_package)?.into_owned();
        let parts: Vec<String> = path
            .components()
            .map(|c| match c {
                std::path::Component::Normal(part) => Ok(part.to_string_lossy().into_owned()),
                _ => Err(refused(format!(
                    "entry '{}' escapes the plugin folder",
                    path.display()
                ))),
            })
            .collect::<Result<_, _>>()?;
        let kind = entry.header().entry_type();
        let (folder, name) = match (parts.as_slice(), kind) {
            ([folder], tar::EntryType::Directory) => (folder.clone(), None),
            ([folder, name], tar::EntryType::Regular) => (folder.clone(), Some(name.clone())),
            _ => {
                return Err(refused(format!(
                    "entry '{}' is not a plain file inside the plugin folder",
                    path.display()
                )))
            }
        };
        match &top {
            Some(t) if *t != folder => {
                return Err(refused(format!(
                    "the package holds more than one folder ('{t}' and '{folder}')"
                )))
            }
            _ => top = Some(folder),
        }
        let Some(name) = name else { continue };
        let mut bytes = Vec::new();
        (&mut entry)
            .take(MAX_UNPACKED - total + 1)
            .read_to_end(&mut bytes)
            .map_err(not_a_package)?;
        total += bytes.len() as u64;
        if total > MAX_UNPACKED {
            return Err(refused(format!(
                "the package unpacks to more than {} MiB",
                MAX_UNPACKED >> 20
            )));
        }
        if files.insert(name.clone(), bytes).is_some() {
            return Err(refused(format!("'{name}' appears twice")));
        }
    }
    let top = top.ok_or_else(|| refused("the package is empty".into()))?;
    Ok((top, files))
}

/// Every file but the checksum file is listed once, with its hash.
fn verify_checksums(files: &BTreeMap<String, Vec<u8>>, sums: &[u8]) -> Result<(), String> {
    let sums = std::str::from_utf8(sums).map_err(|_| format!("{CHECKSUMS_FILE} is not text"))?;
    let mut listed = BTreeMap::new();
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (hash, name) = line
            .split_once("  ")
            .ok_or_else(|| format!("{CHECKSUMS_FILE} has a malformed line: '{line}'"))?;
        listed.insert(name.to_string(), hash.to_ascii_lowercase());
    }
    for (name, bytes) in files.iter().filter(|(n, _)| *n != CHECKSUMS_FILE) {
        match listed.remove(name) {
            None => return Err(format!("'{name}' is not listed in {CHECKSUMS_FILE}")),
            Some(hash) if hash != sha256(bytes) => {
                return Err(format!(
                    "'{name}' does not match its checksum; the package is damaged or was altered, download it again"
                ))
            }
            Some(_) => {}
        }
    }
    match listed.into_keys().next() {
        Some(name) => Err(format!(
            "{CHECKSUMS_FILE} lists '{name}', which the package lacks"
        )),
        None => Ok(()),
    }
}

/// Another folder of `plugins_dir` whose manifest has the id `id`.
fn installed_elsewhere(plugins_dir: &Path, id: &str, target: &Path) -> Option<PathBuf> {
    std::fs::read_dir(plugins_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != target && p.is_dir())
        .find(|p| Manifest::from_dir(p).is_ok_and(|m| m.id == id))
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
