//! `hangar plugin new|check|pack|install`: the plugin author's commands.
//!
//! - `new` writes a plugin crate from the SDK's template ([`crate::template`]);
//! - `check` runs the conformance suite ([`hangar_engine::conformance`]) on a built
//!   plugin folder, or on a crate folder after building it;
//! - `pack` writes a one-file distributable ([`crate::package`]);
//! - `install` checks such a file and unpacks it into a plugins dir.

use crate::output::outln;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use crate::package;
use crate::template::{self, SdkSource};
use hangar_engine::config::{self, Config};
use hangar_engine::conformance::{self, PluginTest};
use hangar_engine::plugin_folder::{PluginFolder, Profile, WASM_TARGET};
use hangar_plugin_api::PluginKind;

/// `hangar plugin …`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Write a new plugin crate from the SDK's template: it builds, passes
    /// the conformance suite and loads in `hangar plugins` as it is.
    New {
        /// The plugin id (lowercase letters, digits and '-'); also the
        /// folder's name.
        name: String,
        /// What kind of plugin.
        #[arg(long, value_enum, default_value_t = Kind::Native)]
        kind: Kind,
        /// The folder to create the plugin's folder in (default: the
        /// current folder).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// A Hangar checkout's `sdk/` folder to depend on by path (default:
        /// the checkout this `hangar` was built from, while it exists; else
        /// crates.io).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Run the conformance checks on a built plugin folder (or a plugin
    /// crate, which is built first) and print a table; exits 1 when a
    /// check fails.
    Check {
        /// A plugin folder (plugin.toml and the artifact) or a plugin crate.
        dir: PathBuf,
        /// A real model folder for the load request (in-process engines
        /// need one to pass the generation checks).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Build a crate with cargo's dev profile instead of --release.
        #[arg(long)]
        debug: bool,
    },
    /// Pack a plugin folder (or a plugin crate, built first) into one
    /// distributable file: plugin.toml, the artifact and their SHA-256
    /// checksums.
    Pack {
        /// A plugin folder (plugin.toml and the artifact) or a plugin crate.
        dir: PathBuf,
        /// The file to write (default: ID-VERSION-OS-ARCH.tar.gz in the
        /// current folder).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// Build a crate with cargo's dev profile instead of --release.
        #[arg(long)]
        debug: bool,
    },
    /// Verify a file written by `hangar plugin pack` and unpack it into
    /// the first --plugins-dir (or the config's first plugins_dirs, or the
    /// data dir's hangar/plugins).
    Install {
        /// The package file.
        file: PathBuf,
        /// Replace an installed plugin of the same id.
        #[arg(long)]
        force: bool,
    },
}

/// The kinds of plugin `hangar plugin new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// A native library built with the SDK (`.so`, `.dylib`).
    Native,
    /// A WebAssembly component, run in the host's sandbox.
    Wasm,
}

/// Runs one `hangar plugin` command. `plugins_dirs` are the `--plugins-dir`
/// folders given on the command line.
pub(crate) fn run(
    command: PluginCommand,
    plugins_dirs: &[PathBuf],
    config: &Config,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::New {
            name,
            kind,
            dir,
            sdk,
        } => new(&name, kind, dir, sdk),
        PluginCommand::Check { dir, model, debug } => {
            check(&dir, model, profile(debug), config, json)
        }
        PluginCommand::Pack { dir, output, debug } => pack(&dir, output, profile(debug)),
        PluginCommand::Install { file, force } => {
            let target = plugins_dirs
                .first()
                .or(config.plugins_dirs.first())
                .cloned()
                .or_else(config::default_plugins_dir)
                .context("no plugins dir: pass --plugins-dir")?;
            let installed = package::install(&file, &target, force)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&installed)?)?;
            } else {
                outln!(
                    "{} plugin {} {} in {}",
                    if installed.replaced {
                        "replaced"
                    } else {
                        "installed"
                    },
                    installed.id,
                    installed.version,
                    installed.dir.display()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn profile(debug: bool) -> Profile {
    if debug {
        Profile::Dev
    } else {
        Profile::Release
    }
}

fn new(
    name: &str,
    kind: Kind,
    dir: Option<PathBuf>,
    sdk: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let dest = dir.unwrap_or_else(|| PathBuf::from(".")).join(name);
    let sdk = match sdk {
        Some(path) => SdkSource::Path(
            path.canonicalize()
                .with_context(|| format!("the SDK folder {} does not exist", path.display()))?,
        ),
        None => SdkSource::default_for_this_build(),
    };
    let kind = match kind {
        Kind::Native => PluginKind::Native,
        Kind::Wasm => PluginKind::Wasm,
    };
    let files = template::write(kind, name, &dest, &sdk)?;
    outln!("created plugin '{name}' in {}:", dest.display())?;
    for file in files {
        outln!("  {}", file.strip_prefix(&dest).unwrap_or(&file).display())?;
    }
    if sdk == SdkSource::Registry {
        outln!(
            "(hangar-sdk comes from crates.io; pass --sdk PATH to use a checkout's sdk/ folder)"
        )?;
    }
    if kind == PluginKind::Wasm {
        outln!("(needs the target once: rustup target add {WASM_TARGET})")?;
    }
    outln!(
        "next: cd {} && cargo test && hangar plugin check . && hangar plugin pack .",
        dest.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

fn check(
    dir: &Path,
    model: Option<PathBuf>,
    profile: Profile,
    config: &Config,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut test = PluginTest::open(dir, profile).map_err(anyhow::Error::msg)?;
    if let Ok(manifest) = test.manifest() {
        let settings = config.plugin_settings(&manifest.id);
        test = test.with_settings(settings);
    }
    if let Some(model) = model {
        test = test.with_model(model);
    }
    let report = conformance::run(&test);
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!("{report}")?;
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn pack(dir: &Path, output: Option<PathBuf>, profile: Profile) -> anyhow::Result<ExitCode> {
    let folder = PluginFolder::open(dir, profile).map_err(anyhow::Error::msg)?;
    let out = match output {
        Some(out) => out,
        None => {
            let manifest = hangar_plugin_api::Manifest::from_dir(folder.path())
                .with_context(|| format!("{} is not a plugin folder", dir.display()))?;
            PathBuf::from(package::default_file_name(&manifest))
        }
    };
    let manifest = package::pack(folder.path(), &out)?;
    outln!(
        "packed plugin {} {} into {}",
        manifest.id,
        manifest.version,
        out.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
