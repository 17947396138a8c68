//! `hangar plugin new`: writes a plugin crate from the SDK's template.
//!
//! The templates live in `sdk/templates/native/` and `sdk/templates/wasm/`
//! (the SDK owns them; their files are compiled into this binary, so
//! `hangar plugin new` works without a checkout). A WebAssembly plugin's
//! source is the native one's: the SDK's `export_plugin!` exports whichever
//! interface the build target calls for, so the wasm template shares
//! `src/`, `tests/` and `.gitignore` and differs in `Cargo.toml`,
//! `plugin.toml` and `README.md`. Placeholders: `{{id}}` the plugin id, `{{crate}}`
//! the package name, `{{lib}}` the library name, `{{sdk}}` and
//! `{{testkit}}` the dependency lines. `Cargo.toml` is stored as
//! `Cargo.toml.tmpl` and `.gitignore` as `gitignore`, so that neither
//! cargo nor git takes the template folder for a crate or rules.

use std::path::{Path, PathBuf};

use hangar_plugin_api::manifest::is_valid_plugin_id;
use hangar_plugin_api::PluginKind;

/// The template's files: name in the new crate, contents.
const NATIVE: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../sdk/templates/native/Cargo.toml.tmpl"),
    ),
    (
        "plugin.toml",
        include_str!("../../../sdk/templates/native/plugin.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../sdk/templates/native/src/lib.rs"),
    ),
    (
        "tests/conformance.rs",
        include_str!("../../../sdk/templates/native/tests/conformance.rs"),
    ),
    (
        "README.md",
        include_str!("../../../sdk/templates/native/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/templates/native/gitignore"),
    ),
];

/// The WebAssembly template's files.
const WASM: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../sdk/templates/wasm/Cargo.toml.tmpl"),
    ),
    (
        "plugin.toml",
        include_str!("../../../sdk/templates/wasm/plugin.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../sdk/templates/native/src/lib.rs"),
    ),
    (
        "tests/conformance.rs",
        include_str!("../../../sdk/templates/native/tests/conformance.rs"),
    ),
    (
        "README.md",
        include_str!("../../../sdk/templates/wasm/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/templates/native/gitignore"),
    ),
];

/// Where the new crate gets `hangar-sdk` and `hangar-sdk-testkit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SdkSource {
    /// A checkout's `sdk/` folder (path dependencies).
    Path(PathBuf),
    /// crates.io, by version requirement.
    Registry,
}

impl SdkSource {
    /// The SDK of the checkout this binary was built from, while it
    /// exists; crates.io otherwise.
    pub(crate) fn default_for_this_build() -> SdkSource {
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
        match sdk.join("testkit/Cargo.toml").is_file() {
            true => SdkSource::Path(sdk.canonicalize().unwrap_or(sdk)),
            false => SdkSource::Registry,
        }
    }

    fn dependency(&self, package: &str, sub: &str, features: &[&str]) -> String {
        let features = match features {
            [] => String::new(),
            some => format!(", features = {some:?}"),
        };
        match self {
            SdkSource::Path(sdk) => {
                let path = if sub.is_empty() {
                    sdk.clone()
                } else {
                    sdk.join(sub)
                };
                format!(
                    "{package} = {{ path = {:?}{features} }}",
                    path.display().to_string()
                )
            }
            SdkSource::Registry => format!("{package} = {{ version = \"0.1\"{features} }}"),
        }
    }
}

/// Why a plugin crate could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateError {
    /// The name is not a plugin id.
    #[error("'{0}' is not a plugin id: use lowercase letters, digits and '-', starting with a letter (e.g. 'my-engine')")]
    InvalidId(String),
    /// The destination is taken.
    #[error("{} already exists and is not empty; choose another name or --dir", .0.display())]
    Exists(PathBuf),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Writes a plugin crate of `kind` for plugin `id` into `dest` (which must
/// not exist, or be empty). Returns the files written.
pub(crate) fn write(
    kind: PluginKind,
    id: &str,
    dest: &Path,
    sdk: &SdkSource,
) -> Result<Vec<PathBuf>, TemplateError> {
    if !is_valid_plugin_id(id) {
        return Err(TemplateError::InvalidId(id.into()));
    }
    if std::fs::read_dir(dest).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(TemplateError::Exists(dest.to_path_buf()));
    }
    let lib = format!("hangar_plugin_{}", id.replace('-', "_"));
    let substitutions = [
        ("{{crate}}", format!("hangar-plugin-{id}")),
        ("{{lib}}", lib),
        ("{{sdk}}", sdk.dependency("hangar-sdk", "", &[])),
        (
            "{{testkit}}",
            // A WebAssembly plugin's tests need the test kit's wasm runtime.
            match kind {
                PluginKind::Native => sdk.dependency("hangar-sdk-testkit", "testkit", &[]),
                PluginKind::Wasm => sdk.dependency("hangar-sdk-testkit", "testkit", &["wasm"]),
            },
        ),
        ("{{id}}", id.to_string()),
    ];
    let mut written = Vec::new();
    let files = match kind {
        PluginKind::Native => NATIVE,
        PluginKind::Wasm => WASM,
    };
    for (name, template) in files {
        let text = substitutions
            .iter()
            .fold(template.to_string(), |text, (from, to)| {
                text.replace(from, to)
            });
        let path = dest.join(name);
        let write = |path: &Path| {
            std::fs::create_dir_all(path.parent().expect("inside dest"))?;
            std::fs::write(path, text)
        };
        write(&path).map_err(|source| TemplateError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}
