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
///
/// Never an absolute path: a crate that names `/home/me/hangar/sdk` builds
/// on one machine only. A path dependency is written relative to the new
/// crate, so the crate and the checkout move together (a plugin inside a
/// checkout, or beside one); anything else asks crates.io.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SdkSource {
    /// A checkout's `sdk/` folder (absolute here; written relative to the
    /// new crate).
    Path(PathBuf),
    /// crates.io, by version requirement.
    Registry,
}

/// The SDK's own manifest, for the version crates.io is asked for.
const SDK_MANIFEST: &str = include_str!("../../../sdk/Cargo.toml");

impl SdkSource {
    /// The default for a crate created at `dest`: the SDK of a checkout
    /// that holds `dest` (`hangar/plugins/my-engine`), else of
    /// `build_checkout` (the checkout this binary was built from, while it
    /// exists) when `dest` lies beside it, under the folder that holds it
    /// (`~/src/hangar` and `~/src/my-engine`); crates.io otherwise.
    pub(crate) fn default_for(dest: &Path, build_checkout: Option<&Path>) -> SdkSource {
        let dest = resolved(dest);
        let inside = dest
            .ancestors()
            .skip(1)
            .find(|dir| is_sdk(&dir.join("sdk")))
            .map(|dir| dir.join("sdk"));
        let beside = || {
            let checkout = resolved(build_checkout?);
            let holder = checkout.parent()?;
            (is_sdk(&checkout.join("sdk")) && dest.starts_with(holder))
                .then(|| checkout.join("sdk"))
        };
        match inside.or_else(beside) {
            Some(sdk) => SdkSource::Path(sdk),
            None => SdkSource::Registry,
        }
    }

    /// The checkout this binary was built from, if it still exists.
    pub(crate) fn build_checkout() -> Option<PathBuf> {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        is_sdk(&checkout.join("sdk")).then_some(checkout)
    }

    /// The dependency line for `package` (`sub` is its folder under
    /// `sdk/`) in a crate at `dest`.
    fn dependency(&self, dest: &Path, package: &str, sub: &str, features: &[&str]) -> String {
        let features = match features {
            [] => String::new(),
            some => format!(", features = {some:?}"),
        };
        match self {
            SdkSource::Path(sdk) => {
                let path = relative(&resolved(dest), &resolved(&sdk.join(sub)));
                format!("{package} = {{ path = {path:?}{features} }}")
            }
            SdkSource::Registry => {
                let version = sdk_version();
                format!("{package} = {{ version = \"{version}\"{features} }}")
            }
        }
    }
}

/// The SDK's version, which crates.io is asked for.
fn sdk_version() -> String {
    let manifest: toml::Table = toml::from_str(SDK_MANIFEST).expect("the SDK's Cargo.toml parses");
    manifest["package"]["version"]
        .as_str()
        .expect("the SDK has a version")
        .to_string()
}

/// Whether `dir` is the SDK folder of a Hangar checkout.
fn is_sdk(dir: &Path) -> bool {
    dir.join("testkit/Cargo.toml").is_file()
        && std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|text| text.contains("name = \"hangar-sdk\""))
}

/// `path` made absolute, with its longest existing part canonical (the
/// new crate's folder does not exist yet).
fn resolved(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for base in path.ancestors() {
        if let Ok(canonical) = base.canonicalize() {
            let rest = path.strip_prefix(base).expect("an ancestor");
            return canonical.join(rest);
        }
    }
    path
}

/// `to` as seen from the folder `from` (both absolute): `../../sdk`.
fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let ups = std::iter::repeat_n("..".to_string(), from.len() - common);
    let downs = to[common..]
        .iter()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let parts: Vec<String> = ups.chain(downs).collect();
    match parts.is_empty() {
        true => ".".into(),
        false => parts.join("/"),
    }
}

/// Why a plugin crate could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateError {
    /// The name is not a plugin id.
    #[error("'{0}' is not a plugin id: use lowercase letters, digits and '-', starting with a letter (e.g. 'my-engine'); the id defaults to the folder's name, --id sets another")]
    InvalidId(String),
    /// The destination is taken.
    #[error("{} already exists and is not empty; choose another folder", .0.display())]
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
        ("{{sdk}}", sdk.dependency(dest, "hangar-sdk", "", &[])),
        (
            "{{testkit}}",
            // A WebAssembly plugin's tests need the test kit's wasm runtime.
            match kind {
                PluginKind::Native => sdk.dependency(dest, "hangar-sdk-testkit", "testkit", &[]),
                PluginKind::Wasm => {
                    sdk.dependency(dest, "hangar-sdk-testkit", "testkit", &["wasm"])
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The SDK dependency `hangar plugin new` writes for a crate at `dest`
    /// (relative to a scratch root holding a checkout `hangar/`), when the
    /// binary was built from `build` (or a checkout since removed).
    fn check(dest: &str, build: Option<&str>, expect: expect_test::Expect) {
        let root = tempfile::tempdir().unwrap();
        let sdk = root.path().join("hangar/sdk");
        std::fs::create_dir_all(sdk.join("testkit")).unwrap();
        std::fs::write(sdk.join("Cargo.toml"), SDK_MANIFEST).unwrap();
        std::fs::write(sdk.join("testkit/Cargo.toml"), "").unwrap();
        let dest = root.path().join(dest);
        let build = build.map(|b| root.path().join(b));
        let source = SdkSource::default_for(&dest, build.as_deref());
        expect.assert_eq(&source.dependency(&dest, "hangar-sdk-testkit", "testkit", &["wasm"]));
    }

    #[test]
    fn the_sdk_dependency_never_names_this_machine() {
        // Inside a checkout: a path up to its sdk/.
        check(
            "hangar/plugins/my-engine",
            None,
            expect_test::expect![[
                r#"hangar-sdk-testkit = { path = "../../sdk/testkit", features = ["wasm"] }"#
            ]],
        );
        // Beside the checkout the binary was built from.
        check(
            "my-engine",
            Some("hangar"),
            expect_test::expect![[
                r#"hangar-sdk-testkit = { path = "../hangar/sdk/testkit", features = ["wasm"] }"#
            ]],
        );
        check(
            "work/deep/my-engine",
            Some("hangar"),
            expect_test::expect![[
                r#"hangar-sdk-testkit = { path = "../../../hangar/sdk/testkit", features = ["wasm"] }"#
            ]],
        );
        // Nowhere near a checkout, or built from one that is gone.
        check(
            "my-engine",
            None,
            expect_test::expect![[
                r#"hangar-sdk-testkit = { version = "0.1.0", features = ["wasm"] }"#
            ]],
        );
        check(
            "my-engine",
            Some("gone"),
            expect_test::expect![[
                r#"hangar-sdk-testkit = { version = "0.1.0", features = ["wasm"] }"#
            ]],
        );
    }
}
