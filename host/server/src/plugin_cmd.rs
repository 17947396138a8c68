//! `hangar plugin new|check|pack|install`: the plugin author's commands.
//!
//! - `new` writes a plugin crate from the SDK's template ([`crate::template`]);
//! - `check` runs the conformance suite ([`hangar_engine::conformance`]) on a built
//!   plugin folder, or on a crate folder after building it;
//! - `pack` writes a one-file distributable ([`crate::package`]);
//! - `install` checks such a file and unpacks it into a plugins dir.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use crate::output::outln;
use crate::package;
use crate::template::{self, SdkSource};
use hangar_engine::config::{self, Config};
use hangar_engine::conformance::{self, PluginTest};
use hangar_engine::plugin_folder::{PluginFolder, Profile, WASM_TARGET};
use hangar_engine::registry::programs::{self, ALLOW_PROGRAMS};
use hangar_plugin_api::{Manifest, PluginKind};
use serde_json::Value;

/// `hangar plugin …`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Write a new plugin crate from the SDK's template: it builds, passes
    /// the conformance suite and loads in `hangar plugins` as it is.
    New {
        /// The folder to create (it must not exist, or be empty); its name
        /// is the plugin id unless --id says otherwise.
        dir: PathBuf,
        /// The plugin id (lowercase letters, digits and '-'; default: the
        /// folder's name).
        #[arg(long)]
        id: Option<String>,
        /// What kind of plugin.
        #[arg(long, value_enum, default_value_t = Kind::Native)]
        kind: Kind,
        /// Depend on the SDK of this Hangar checkout's `sdk/` folder, by a
        /// path relative to the new crate (default: the checkout that
        /// holds the new folder, or the one this `hangar` was built from
        /// when the new folder is beside it; else crates.io).
        #[arg(long, value_name = "DIR", conflicts_with = "crates_io")]
        sdk_path: Option<PathBuf>,
        /// Depend on the SDK from crates.io even inside a checkout.
        #[arg(long)]
        crates_io: bool,
    },
    /// Run the conformance checks on a built plugin folder (or a plugin
    /// crate, which is built first) and print a table; exits 1 when a
    /// check fails.
    Check {
        /// A plugin folder (plugin.toml and the artifact) or a plugin crate.
        dir: PathBuf,
        /// A real model (file or folder) as the suite's fixture, instead of
        /// plugin.toml's `[conformance] fixture` (in-process engines need
        /// one to pass the generation checks).
        #[arg(long, visible_alias = "fixture")]
        model: Option<PathBuf>,
        /// Build a crate with cargo's dev profile instead of --release.
        #[arg(long)]
        debug: bool,
        /// Build a crate as this kind of plugin, whatever its plugin.toml
        /// says (one source can ship as both).
        #[arg(long, value_enum)]
        kind: Option<Kind>,
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
        /// Build a crate as this kind of plugin, whatever its plugin.toml
        /// says; the packed plugin.toml says it too.
        #[arg(long, value_enum)]
        kind: Option<Kind>,
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
        /// Install without asking (the programs the plugin may run are
        /// still listed). Needed when stdin is not a terminal.
        #[arg(long, short = 'y')]
        yes: bool,
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

impl Kind {
    fn plugin_kind(self) -> PluginKind {
        match self {
            Kind::Native => PluginKind::Native,
            Kind::Wasm => PluginKind::Wasm,
        }
    }
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
            dir,
            id,
            kind,
            sdk_path,
            crates_io,
        } => new(&dir, id, kind, sdk_path, crates_io),
        PluginCommand::Check {
            dir,
            model,
            debug,
            kind,
        } => check(
            &dir,
            model,
            profile(debug),
            kind.map(Kind::plugin_kind),
            config,
            json,
        ),
        PluginCommand::Pack {
            dir,
            output,
            debug,
            kind,
        } => pack(&dir, output, profile(debug), kind.map(Kind::plugin_kind)),
        PluginCommand::Install { file, force, yes } => {
            let target = plugins_dirs
                .first()
                .or(config.plugins_dirs.first())
                .cloned()
                .or_else(config::default_plugins_dir)
                .context("no plugins dir: pass --plugins-dir")?;
            let approve = |manifest: &Manifest| {
                let settings = config.plugin_settings(&manifest.id);
                eprint!("{}", programs_listing(manifest, &settings));
                let stdin = std::io::stdin();
                let not_installed = format!("plugin '{}' was not installed", manifest.id);
                if yes {
                    Ok(())
                } else if !stdin.is_terminal() {
                    Err(format!(
                        "{not_installed}: stdin is not a terminal to ask on; pass --yes to install it"
                    ))
                } else if ask(&mut stdin.lock(), &mut std::io::stderr()) {
                    Ok(())
                } else {
                    Err(not_installed)
                }
            };
            let installed = package::install(&file, &target, force, approve)?;
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

/// What `hangar plugin install` shows before it installs: the plugin, what
/// its kind of code may do, and every program it may have the host run
/// (with the operator's allowance for shells and interpreters).
fn programs_listing(manifest: &Manifest, settings: &BTreeMap<String, Value>) -> String {
    let kind = match manifest.kind {
        PluginKind::Native => {
            "native code: it runs in the host (or its worker) with your user's permissions"
        }
        PluginKind::Wasm => "WebAssembly: sandboxed, no files, processes or network of its own",
    };
    let mut out = format!("plugin {} {} ({kind})\n", manifest.id, manifest.version);
    let declared = programs::declared(manifest, settings);
    if declared.is_empty() {
        out.push_str("  it names no programs for the host to run\n");
    } else {
        out.push_str("  programs it may have the host run:\n");
    }
    for p in declared {
        let note = match (p.interpreter, p.allowed) {
            (false, _) => String::new(),
            (true, true) => format!(
                "  shell or interpreter, allowed by [plugins.{}] {ALLOW_PROGRAMS}",
                manifest.id
            ),
            (true, false) => format!(
                "  shell or interpreter: refused until you add `{ALLOW_PROGRAMS} = [\"{}\"]` under [plugins.{}] in config.toml",
                p.program, manifest.id
            ),
        };
        out.push_str(&format!("    {} ({}){note}\n", p.program, p.declared_in));
    }
    out
}

/// Asks on `output` whether to install; only an answer starting with `y`
/// is a yes.
fn ask(input: &mut dyn BufRead, output: &mut dyn Write) -> bool {
    let _ = write!(output, "install it? [y/N] ");
    let _ = output.flush();
    let mut answer = String::new();
    let _ = input.read_line(&mut answer);
    answer.trim_start().to_ascii_lowercase().starts_with('y')
}

fn profile(debug: bool) -> Profile {
    if debug {
        Profile::Dev
    } else {
        Profile::Release
    }
}

fn new(
    dest: &Path,
    id: Option<String>,
    kind: Kind,
    sdk_path: Option<PathBuf>,
    crates_io: bool,
) -> anyhow::Result<ExitCode> {
    let id = match id {
        Some(id) => id,
        None => dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| {
                format!(
                    "{} names no folder; pass a folder such as my-engine",
                    dest.display()
                )
            })?,
    };
    let sdk = match (sdk_path, crates_io) {
        (Some(path), _) => {
            let sdk = path
                .canonicalize()
                .with_context(|| format!("the SDK folder {} does not exist", path.display()))?;
            anyhow::ensure!(
                sdk.join("testkit/Cargo.toml").is_file(),
                "{} is not a Hangar checkout's sdk/ folder (it has no testkit/Cargo.toml)",
                path.display()
            );
            SdkSource::Path(sdk)
        }
        (None, true) => SdkSource::Registry,
        (None, false) => SdkSource::default_for(dest, SdkSource::build_checkout().as_deref()),
    };
    let kind = kind.plugin_kind();
    let files = template::write(kind, &id, dest, &sdk)?;
    outln!("created plugin '{id}' in {}:", dest.display())?;
    for file in files {
        outln!("  {}", file.strip_prefix(dest).unwrap_or(&file).display())?;
    }
    if sdk == SdkSource::Registry {
        outln!(
            "(hangar-sdk comes from crates.io; --sdk-path DIR depends on a checkout's sdk/ folder instead)"
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
    kind: Option<PluginKind>,
    config: &Config,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut test = PluginTest::open(dir, profile, kind).map_err(anyhow::Error::msg)?;
    if let Ok(manifest) = test.manifest() {
        let settings = config.plugin_settings(&manifest.id);
        test = test.with_settings(settings);
    }
    if let Some(model) = model {
        test = test.with_fixture(model);
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

fn pack(
    dir: &Path,
    output: Option<PathBuf>,
    profile: Profile,
    kind: Option<PluginKind>,
) -> anyhow::Result<ExitCode> {
    let folder = PluginFolder::open(dir, profile, kind).map_err(anyhow::Error::msg)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The listing and the answer for a manifest declaring `programs`
    /// (beside its probe program), under `settings`, answering `input`.
    fn check(programs: &str, settings: &str, input: &str, expect: expect_test::Expect) {
        let manifest = Manifest::parse(&format!(
            r#"
id = "demo"
name = "demo"
version = "0.1.0"
plugin_api = "^1.0"
kind = "wasm"
artifact = "demo"
formats = ["gguf"]
programs = {programs}
[[platforms]]
os = "linux"
arch = "x86_64"
accelerators = ["cpu"]
[probe]
program = "demo-server"
"#
        ))
        .unwrap();
        let settings: BTreeMap<String, Value> = serde_json::from_str(settings).unwrap();
        let mut shown = programs_listing(&manifest, &settings).into_bytes();
        let yes = ask(&mut input.as_bytes(), &mut shown);
        expect.assert_eq(&format!(
            "{}\n→ {}",
            String::from_utf8(shown).unwrap(),
            if yes { "install" } else { "do not install" }
        ));
    }

    #[test]
    fn install_lists_the_programs_and_asks() {
        check(
            "[]",
            "{}",
            "y\n",
            expect_test::expect![[r#"
            plugin demo 0.1.0 (WebAssembly: sandboxed, no files, processes or network of its own)
              programs it may have the host run:
                demo-server (probe)
            install it? [y/N] 
            → install"#]],
        );
        check(
            r#"["demo-server", "/bin/sh", "python3"]"#,
            r#"{"allow_programs": ["python3"]}"#,
            "\n",
            expect_test::expect![[r#"
                plugin demo 0.1.0 (WebAssembly: sandboxed, no files, processes or network of its own)
                  programs it may have the host run:
                    demo-server (probe)
                    /bin/sh (programs)  shell or interpreter: refused until you add `allow_programs = ["/bin/sh"]` under [plugins.demo] in config.toml
                    python3 (programs)  shell or interpreter, allowed by [plugins.demo] allow_programs
                install it? [y/N] 
                → do not install"#]],
        );
        check(
            "[]",
            "{}",
            "nope\n",
            expect_test::expect![[r#"
            plugin demo 0.1.0 (WebAssembly: sandboxed, no files, processes or network of its own)
              programs it may have the host run:
                demo-server (probe)
            install it? [y/N] 
            → do not install"#]],
        );
    }
}
