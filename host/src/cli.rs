//! The command line: `hangar plugins`, `hangar resolve`, `hangar platform`,
//! `hangar serve`, and the plugin author's `hangar plugin …`.
//!
//! Every command prints a human-readable table by default and JSON with
//! `--json`, for scripts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use comfy_table::{presets::NOTHING, ContentArrangement, Table};
use serde::Serialize;

use crate::config::{self, Config};
use crate::platform;
use crate::registry::{EngineState, Registry};
use crate::settings::SettingsStore;

/// Hangar: one API over every local LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "hangar", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// A folder of plugin folders; repeatable. Searched before the config's
    /// `plugins_dirs` and the data dir's `plugins/`.
    #[arg(
        long = "plugins-dir",
        global = true,
        env = "HANGAR_PLUGINS_DIR",
        value_delimiter = ':'
    )]
    pub plugins_dirs: Vec<PathBuf>,
    /// The config file (default: the config dir's hangar/config.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every plugin: status, formats, platforms, priority, engine
    /// version and capabilities, or what is wrong with it.
    Plugins,
    /// Show which engine serves a model folder or format, and why every
    /// other plugin does not.
    Resolve {
        /// A model folder, or a format name (`mlx`, `safetensors`, `gguf`).
        model: String,
    },
    /// Show this machine's platform as plugins see it.
    Platform,
    /// Serve every model of the model dirs behind one OpenAI-compatible API.
    Serve(ServeArgs),
    /// Write, check, pack and install plugins.
    Plugin {
        #[command(subcommand)]
        command: crate::plugin_cmd::PluginCommand,
    },
    /// Internal: hosts one in-process engine in a child process of its own,
    /// serving the OpenAI routes on the load request's port.
    #[command(hide = true)]
    Worker {
        /// The plugin folder.
        #[arg(long)]
        plugin_dir: PathBuf,
        /// The load request (JSON) the host wrote.
        #[arg(long)]
        request: PathBuf,
    },
    /// Internal: stands between the host and one engine process so that no
    /// engine outlives the host.
    #[command(hide = true)]
    Keeper {
        /// The engine program.
        program: String,
        /// Its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Options of `hangar serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A folder whose subfolders are models (or a Hugging Face cache);
    /// repeatable. Added to the config's `model_dirs`.
    #[arg(long = "model-dir", env = "HANGAR_MODEL_DIR", value_delimiter = ':')]
    pub model_dirs: Vec<PathBuf>,
    /// Address to bind. Anything but loopback needs an API key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Port to bind (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The key clients must send as `Authorization: Bearer KEY`.
    #[arg(long, env = "HANGAR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Where sessions keep their work folders (default: the data dir's
    /// hangar/state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // A worker's output is its session's log, where engine events belong;
    // everything else stays quiet unless HANGAR_LOG says otherwise.
    let default_level = match cli.command {
        Command::Worker { .. } => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HANGAR_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Keeper { program, args } => {
            return Ok(crate::supervisor::keeper::run(program, args))
        }
        Command::Worker {
            plugin_dir,
            request,
        } => return crate::worker::run(plugin_dir, request),
        _ => {}
    }
    let config = Config::load(cli.global.config.as_deref())?;
    crate::loader::wasm::configure(&config.wasm);
    if let Command::Plugin { command } = cli.command {
        return crate::plugin_cmd::run(command, &cli.global.plugins_dirs, &config, cli.global.json);
    }
    let machine = platform::current(config.platform.as_deref()).map_err(anyhow::Error::msg)?;
    if let Command::Platform = cli.command {
        print(cli.global.json, &machine, || machine.to_string());
        return Ok(ExitCode::SUCCESS);
    }
    let mut dirs = cli.global.plugins_dirs.clone();
    dirs.extend(config.plugins_dirs.iter().cloned());
    let required = dirs.clone();
    dirs.extend(config::default_plugins_dir());
    let registry = Registry::scan(&dirs, &required, config, machine);
    match cli.command {
        Command::Serve(args) => {
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            crate::serve::run(registry, settings, args)
        }
        Command::Plugins => {
            let report = plugins_report(&registry);
            print(cli.global.json, &report, || plugins_table(&report));
            Ok(ExitCode::SUCCESS)
        }
        Command::Resolve { model } => {
            let format = format_of(&model)?;
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            let resolution = registry.resolve(&format, &settings.get().default_engines);
            print(cli.global.json, &resolution, || {
                resolution_table(&resolution)
            });
            Ok(if resolution.chosen.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            })
        }
        Command::Platform
        | Command::Plugin { .. }
        | Command::Keeper { .. }
        | Command::Worker { .. } => {
            unreachable!("handled above")
        }
    }
}

/// A model folder's format, or the argument itself when it names a format.
fn format_of(model: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(model);
    if path.exists() {
        return crate::models::detect_format(path).map_err(anyhow::Error::msg);
    }
    if model.contains(['/', '\\']) {
        anyhow::bail!("model folder {model} does not exist");
    }
    Ok(model.to_string())
}

fn print<T: Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("reports serialize")
        );
    } else {
        println!("{}", human());
    }
}

/// One row of `hangar plugins`.
#[derive(Debug, Serialize)]
pub struct PluginRow {
    /// Plugin id, or the folder name for a broken plugin.
    pub id: String,
    /// `ready`, `unavailable`, `unsupported-platform`, `broken`.
    pub status: &'static str,
    /// Plugin folder.
    pub dir: PathBuf,
    /// Formats served.
    pub formats: Vec<String>,
    /// Platform entries.
    pub platforms: Vec<String>,
    /// Priority.
    pub priority: Option<i32>,
    /// Probed engine version.
    pub engine_version: Option<String>,
    /// Capabilities that are on.
    pub capabilities_on: Vec<String>,
    /// Capabilities that are off, with the reason.
    pub capabilities_off: Vec<String>,
    /// Why the plugin is not ready, or a note from its probe.
    pub detail: Option<String>,
}

/// `hangar plugins`, as data.
#[derive(Debug, Serialize)]
pub struct PluginsReport {
    /// The machine.
    pub platform: String,
    /// Every plugin folder, valid or not.
    pub plugins: Vec<PluginRow>,
    /// Problems that belong to no single plugin folder.
    pub registry_errors: Vec<String>,
}

/// Loads every plugin that fits this machine and reports on all of them.
pub fn plugins_report(registry: &Registry) -> PluginsReport {
    let mut plugins: Vec<PluginRow> = registry
        .plugins()
        .iter()
        .map(|entry| {
            let m = &entry.manifest;
            let mut row = PluginRow {
                id: m.id.clone(),
                status: "ready",
                dir: entry.dir.clone(),
                formats: m.formats.clone(),
                platforms: m.platforms.iter().map(ToString::to_string).collect(),
                priority: Some(m.priority),
                engine_version: None,
                capabilities_on: Vec::new(),
                capabilities_off: Vec::new(),
                detail: None,
            };
            if entry.accelerator.is_none() {
                row.status = "unsupported-platform";
                row.detail = Some(format!("does not run on {}", registry.platform()));
                return row;
            }
            match registry.engine(entry) {
                EngineState::Broken(reason) => {
                    row.status = "broken";
                    row.detail = Some(reason.clone());
                }
                EngineState::Unavailable { reason, .. } => {
                    row.status = "unavailable";
                    row.detail = Some(reason.clone());
                }
                EngineState::Ready(engine) => {
                    row.engine_version = engine
                        .version
                        .as_ref()
                        .map(ToString::to_string)
                        .or_else(|| Some("unknown".into()));
                    for (id, state) in &engine.capabilities {
                        match state {
                            crate::registry::CapabilityState::On => {
                                row.capabilities_on.push(id.clone())
                            }
                            crate::registry::CapabilityState::Off { reason } => {
                                row.capabilities_off.push(reason.clone())
                            }
                        }
                    }
                    row.detail = engine.report.detail.clone();
                }
            }
            row
        })
        .collect();
    let mut registry_errors = Vec::new();
    for d in registry.diagnostics() {
        if d.location == std::path::Path::new("<registry>") {
            registry_errors.push(d.reason.clone());
            continue;
        }
        plugins.push(PluginRow {
            id: d.plugin.clone().unwrap_or_else(|| {
                d.location
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            status: "broken",
            dir: d.location.clone(),
            formats: Vec::new(),
            platforms: Vec::new(),
            priority: None,
            engine_version: None,
            capabilities_on: Vec::new(),
            capabilities_off: Vec::new(),
            detail: Some(d.reason.clone()),
        });
    }
    PluginsReport {
        platform: registry.platform().to_string(),
        plugins,
        registry_errors,
    }
}

/// A table in the style of every `hangar` command.
pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}

fn plugins_table(report: &PluginsReport) -> String {
    let mut t = table(&[
        "PLUGIN",
        "STATUS",
        "FORMATS",
        "PLATFORMS",
        "PRIORITY",
        "ENGINE",
        "CAPABILITIES",
    ]);
    let mut notes = Vec::new();
    for row in &report.plugins {
        t.add_row(vec![
            row.id.clone(),
            row.status.to_string(),
            row.formats.join(","),
            row.platforms.join(" "),
            row.priority.map(|p| p.to_string()).unwrap_or_default(),
            row.engine_version.clone().unwrap_or_default(),
            row.capabilities_on.join(","),
        ]);
        if let Some(detail) = &row.detail {
            notes.push(format!("{} ({}): {detail}", row.id, row.dir.display()));
        }
        for off in &row.capabilities_off {
            notes.push(format!("{}: off: {off}", row.id));
        }
    }
    let mut out = format!("platform: {}\n{t}", report.platform);
    for note in notes.iter().chain(&report.registry_errors) {
        out.push_str(&format!("\n- {note}"));
    }
    out
}

fn resolution_table(r: &crate::registry::resolve::Resolution) -> String {
    let mut out = String::new();
    if let Some(alias) = &r.alias {
        out.push_str(&format!("alias: {alias}\n"));
    }
    match &r.chosen {
        Some(id) => out.push_str(&format!("{} → {id} ({})\n", r.format, r.reason)),
        None => out.push_str(&format!("{} → no engine ({})\n", r.format, r.reason)),
    }
    let mut t = table(&["PLUGIN", "PRIORITY", "ENGINE", "VERDICT"]);
    for e in &r.trace {
        let verdict = match &e.verdict {
            crate::registry::resolve::Verdict::Chosen => "chosen".to_string(),
            crate::registry::resolve::Verdict::Outranked => "outranked".to_string(),
            crate::registry::resolve::Verdict::Rejected(reason) => format!("rejected: {reason}"),
        };
        t.add_row(vec![
            e.plugin.clone(),
            e.priority.to_string(),
            e.engine_version.clone().unwrap_or_default(),
            verdict,
        ]);
    }
    out.push_str(&t.to_string());
    out
}
