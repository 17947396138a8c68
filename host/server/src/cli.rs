//! The command line: `hangar plugins`, `hangar resolve`, `hangar platform`,
//! `hangar serve`, `hangar bench`, `hangar pull`, `hangar models`, `hangar rm`, `hangar ps`, and the plugin author's `hangar plugin …`.
//!
//! Every command prints a human-readable table by default and JSON with
//! `--json`, for scripts.

use crate::output::outln;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::settings::SettingsStore;
use hangar_engine::config::{self, Config};
use hangar_engine::models::{self, Model};
use hangar_engine::platform;
use hangar_engine::registry::report::{plugins_report, PluginsReport};
use hangar_engine::registry::resolve::{Resolution, Verdict};
use hangar_engine::registry::Registry;
use hangar_engine::text::table;

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
    /// Compare engines on the same model: load time, time to first token
    /// (cold and warm), tokens/s, memory, with provenance.
    Bench(crate::bench::BenchArgs),
    /// Download a model from a Hugging Face-compatible hub into the Hugging
    /// Face cache (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE` / `HF_HOME`),
    /// after saying what it is and which engine would serve it.
    Pull(crate::pull::PullArgs),
    /// List every model in the model dirs and caches: format, kind, the
    /// engine that would serve it, size on disk, whether the running server
    /// has it loaded, and where it is.
    Models(crate::models_cmd::ModelsArgs),
    /// Remove a model from disk (asks first; refuses while the running
    /// server has it loaded unless --force, which unloads it first).
    Rm(crate::models_cmd::RmArgs),
    /// Show what the running server has loaded: engine, state, memory,
    /// idle time and TTL left.
    Ps(crate::models_cmd::PsArgs),
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
    /// Also answer Ollama's API at the root of this port (11434 is the one
    /// Ollama's clients default to); on --port it is under /ollama.
    #[arg(long)]
    pub ollama_port: Option<u16>,
    /// The key clients must send as `Authorization: Bearer KEY`.
    #[arg(long, env = "HANGAR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Where sessions keep their work folders (default: the data dir's
    /// hangar/state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Memory kept free for the system and other programs: off, safe
    /// (12 GiB static, 2 GiB for others), balanced (8 GiB, 1 GiB) or
    /// aggressive (6 GiB, 512 MiB). A model that does not fit evicts idle
    /// models first, then is refused with a 503.
    #[arg(long, default_value = "off", value_parser = parse_guard)]
    pub memory_guard: crate::scheduler::guard::Guard,
    /// The most the loaded models may hold, in bytes (`8G`, `512M` and
    /// `1024K` too).
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// Models loaded at once; one more evicts the least recently used idle
    /// unpinned model.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_loaded_models: Option<u64>,
    /// Requests served at once over every model; more wait in a FIFO queue.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_concurrent_requests: Option<u64>,
    /// Requests that may wait; one more is refused with 429 and Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Seconds a request may wait in the queue before a 429.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    pub queue_timeout: f64,
}

fn parse_guard(s: &str) -> Result<crate::scheduler::guard::Guard, String> {
    s.parse()
}

/// Bytes, with an optional K, M, G or T suffix (powers of 1024).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "'{s}' is not a size: use bytes, or a number with K, M, G or T"
                    ))
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size: use bytes, or a number with K, M, G or T"))?;
    n.checked_mul(1u64 << shift)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{s}' is not a usable size (zero, or too large)"))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n <= 86_400.0 => Ok(n),
        _ => Err(format!(
            "'{s}' is not a number of seconds between 0 and 86400"
        )),
    }
}

impl From<ServeArgs> for crate::serve::Options {
    fn from(args: ServeArgs) -> Self {
        crate::serve::Options {
            model_dirs: args.model_dirs,
            host: args.host,
            port: args.port,
            ollama_port: args.ollama_port,
            api_key: args.api_key,
            state_dir: args.state_dir,
            limits: crate::scheduler::machine::Limits {
                max_concurrent: args
                    .max_concurrent_requests
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                max_queue: args.max_queued_requests,
                queue_timeout: (args.queue_timeout * 1000.0) as u64,
                max_loaded: args
                    .max_loaded_models
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                guard: args.memory_guard,
                memory_limit: args.memory_limit,
            },
        }
    }
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
        // The reader of our output went away (`| head`): nothing to report.
        Err(e) if crate::output::is_closed_pipe(&e) => ExitCode::SUCCESS,
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
    hangar_engine::loader::wasm::configure(&config.wasm);
    if let Command::Plugin { command } = cli.command {
        return crate::plugin_cmd::run(command, &cli.global.plugins_dirs, &config, cli.global.json);
    }
    let machine = platform::current(config.platform.as_deref()).map_err(anyhow::Error::msg)?;
    if let Command::Platform = cli.command {
        print(cli.global.json, &machine, || machine.to_string())?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut dirs = cli.global.plugins_dirs.clone();
    dirs.extend(config.plugins_dirs.iter().cloned());
    let required = dirs.clone();
    dirs.extend(config::default_plugins_dir());
    let registry = Registry::scan(&dirs, &required, config, machine);
    match cli.command {
        Command::Bench(args) => crate::bench::run(
            args,
            registry,
            crate::bench::Invocation {
                plugins_dirs: cli.global.plugins_dirs.clone(),
                config: cli.global.config.clone(),
                settings: config::settings_path(cli.global.config.as_deref()),
                json: cli.global.json,
            },
        ),
        Command::Serve(args) => {
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            crate::serve::run(registry, settings, args.into())
        }
        Command::Pull(args) => {
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            crate::pull::run(
                args,
                &registry,
                &settings.get().default_engines,
                cli.global.json,
            )
        }
        Command::Models(args) => {
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            let defaults = settings.get().default_engines;
            crate::models_cmd::models(&args, &registry, &defaults, cli.global.json)
        }
        Command::Rm(args) => crate::models_cmd::rm(&args, &registry, cli.global.json),
        Command::Ps(args) => crate::models_cmd::ps(&args, cli.global.json),
        Command::Plugins => {
            let report = plugins_report(&registry);
            print(cli.global.json, &report, || plugins_table(&report))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Resolve { model } => {
            let recognized = recognized(&model, &registry)?;
            let needs = recognized.as_ref().map(Model::needs).unwrap_or_default();
            let format = recognized.as_ref().map_or(model, |m| m.format.clone());
            let settings =
                SettingsStore::open(config::settings_path(cli.global.config.as_deref()))?;
            let resolution =
                registry.resolve_needing(&format, &needs, &settings.get().default_engines);
            let answer = ResolveAnswer {
                model: recognized,
                resolution,
            };
            print(cli.global.json, &answer, || resolution_table(&answer))?;
            Ok(if answer.resolution.chosen.is_some() {
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

/// `hangar resolve`'s answer: the model a path is (with the rule that
/// recognised it), and the resolution of its format.
#[derive(Serialize)]
struct ResolveAnswer<'r> {
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<Model>,
    #[serde(flatten)]
    resolution: Resolution<'r>,
}

/// The model at path `model` as the registry's rules recognise it, `None`
/// when the argument names a format, or why the path is not a model.
fn recognized(model: &str, registry: &Registry) -> anyhow::Result<Option<Model>> {
    let path = std::path::Path::new(model);
    if path.exists() {
        return models::recognize(path, registry.rules())
            .map(Some)
            .map_err(anyhow::Error::msg);
    }
    if model.contains(['/', '\\']) {
        anyhow::bail!("model {model} does not exist");
    }
    Ok(None)
}

fn print<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> std::io::Result<()> {
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(value).expect("reports serialize")
        )
    } else {
        outln!("{}", human())
    }
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
        if !row.recognizes.is_empty() {
            notes.push(format!(
                "{}: recognises {}",
                row.id,
                row.recognizes.join("; ")
            ));
        }
    }
    let mut out = format!("platform: {}\n{t}", report.platform);
    for note in notes.iter().chain(&report.registry_errors) {
        out.push_str(&format!("\n- {note}"));
    }
    out
}

fn resolution_table(answer: &ResolveAnswer<'_>) -> String {
    let r = &answer.resolution;
    let mut out = String::new();
    if let Some(m) = &answer.model {
        let model_type = m
            .model_type
            .as_ref()
            .map(|t| format!("model_type {t}; "))
            .unwrap_or_default();
        out.push_str(&format!(
            "model: {} ({}, rule {}; {model_type}files: {})\n",
            m.id,
            m.path.display(),
            m.rule,
            m.files.join(", ")
        ));
    }
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
            Verdict::Chosen => "chosen".to_string(),
            Verdict::Outranked => "outranked".to_string(),
            Verdict::Rejected(reason) => format!("rejected: {reason}"),
        };
        t.add_row(vec![
            e.plugin.to_string(),
            e.priority.to_string(),
            e.engine_version
                .map(ToString::to_string)
                .unwrap_or_default(),
            verdict,
        ]);
    }
    out.push_str(&t.to_string());
    out
}
