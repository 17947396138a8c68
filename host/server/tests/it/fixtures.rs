//! Test fixtures: example plugins built from the SDK's examples, plugin
//! folders written into temporary plugins dirs, fake engine programs, and
//! one `hangar` runner whose output is normalised for snapshots.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hangar_engine::config::Config;
use hangar_engine::conformance::PluginTest;

/// The folder the SDK's example plugins are built into (built once per test
/// run with the same cargo and profile as the tests).
pub fn examples_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .unwrap();
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "hangar-sdk", "--examples"])
            .current_dir(root)
            .status()
            .expect("cargo runs");
        assert!(
            status.success(),
            "building the SDK's example plugins failed"
        );
        // target/debug/deps/it-… → target/debug/examples
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("examples")
    })
}

/// An SDK example built for WebAssembly (`wasm32-unknown-unknown`, once per
/// test run): the same source as the native example, exported through the
/// `hangar:engine` world.
pub fn wasm_example(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap();
        let mut command = Command::new(cargo);
        command.args(["build", "--quiet", "-p", "hangar-sdk"]);
        command.args(["--target", "wasm32-unknown-unknown"]);
        for example in WASM_EXAMPLES {
            command.args(["--example", example]);
        }
        let status = command.current_dir(root).status().expect("cargo runs");
        assert!(
            status.success(),
            "building the SDK's examples for wasm32-unknown-unknown failed (rustup target add wasm32-unknown-unknown)"
        );
    });
    target_dir().join(format!("wasm32-unknown-unknown/debug/examples/{name}.wasm"))
}

/// The examples the WebAssembly tests use.
const WASM_EXAMPLES: &[&str] = &["engine_beta", "engine_panics", "wasm_misbehaves"];

/// The cargo target dir these tests were built into (`target/debug/deps/it-…`
/// → `target`), for nested builds that should reuse its dependencies.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

/// What a nested cargo needs when HOME points elsewhere: the real cargo
/// and rustup homes, and this build's target dir (so a plugin crate built
/// in a test reuses the workspace's compiled dependencies).
pub fn cargo_env() -> Vec<(&'static str, PathBuf)> {
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME is set"));
    let var = |name: &str, default: PathBuf| std::env::var_os(name).map_or(default, PathBuf::from);
    vec![
        ("CARGO_HOME", var("CARGO_HOME", home.join(".cargo"))),
        ("RUSTUP_HOME", var("RUSTUP_HOME", home.join(".rustup"))),
        ("CARGO_TARGET_DIR", target_dir()),
    ]
}

/// The path of one built example library (`engine_alpha`, …).
pub fn example_library(name: &str) -> PathBuf {
    examples_dir().join(format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

/// What the example plugins that plan `python3 -m http.server` as their
/// engine (`engine_beta`, `wasm_misbehaves`) need in `config.toml`: the
/// operator's leave to run an interpreter.
pub fn allow_python(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| format!("[plugins.{id}]\nallow_programs = [\"python3\"]\n"))
        .collect()
}

/// A temporary plugins dir and config to run `hangar` against.
pub struct Scenario {
    pub root: tempfile::TempDir,
    pub platform: String,
}

impl Scenario {
    pub fn new() -> Scenario {
        Scenario {
            root: tempfile::tempdir().unwrap(),
            platform: "linux/x86_64/cpu".into(),
        }
    }

    pub fn plugins_dir(&self) -> PathBuf {
        self.root.path().join("plugins")
    }

    /// Writes a plugin folder `name` with `manifest` and, if given, a copy
    /// of an example library under the artifact name `library`.
    pub fn plugin(&self, name: &str, manifest: &str, library: Option<&str>) -> PathBuf {
        let dir = self.plugins_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("plugin.toml"), manifest).unwrap();
        if let Some(library) = library {
            std::fs::copy(example_library(library), dir.join(lib_file(library))).unwrap();
        }
        dir
    }

    /// Writes a WebAssembly plugin folder `name` with `manifest` (a native
    /// one from [`manifest`] is turned into a wasm one) and the example
    /// `example` built for WebAssembly as `<example>.wasm`.
    pub fn wasm_plugin(&self, name: &str, manifest: &str, example: &str) -> PathBuf {
        let dir = self.plugins_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = manifest.replace("kind = \"native\"", "kind = \"wasm\"");
        std::fs::write(dir.join("plugin.toml"), manifest).unwrap();
        std::fs::copy(wasm_example(example), dir.join(format!("{example}.wasm"))).unwrap();
        dir
    }

    /// Writes an executable that prints `output` and exits 0, standing in
    /// for an engine's `--version`.
    pub fn engine_program(&self, name: &str, output: &str) -> PathBuf {
        let path = self.root.path().join("bin").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\necho '{output}'\n")).unwrap();
        make_executable(&path);
        path
    }

    pub fn config(&self, text: &str) {
        std::fs::write(self.root.path().join("config.toml"), text).unwrap();
    }

    /// The plugin folder `dir` loaded for the conformance suite with the
    /// settings this scenario's config gives its plugin, as `hangar plugin
    /// check` loads it.
    pub fn plugin_test(&self, dir: &Path) -> PluginTest {
        let test = PluginTest::new(dir);
        let config = self.root.path().join("config.toml");
        match (config.exists(), test.manifest()) {
            (true, Ok(manifest)) => {
                let settings = Config::load(Some(&config))
                    .unwrap()
                    .plugin_settings(&manifest.id);
                test.with_settings(settings)
            }
            _ => test,
        }
    }

    /// Writes `settings.toml`, which lives beside the config file.
    pub fn settings(&self, text: &str) {
        std::fs::write(self.root.path().join("settings.toml"), text).unwrap();
    }

    /// Runs `hangar ARGS` against this scenario; returns exit code and
    /// stdout with the scenario's paths replaced by `$ROOT`.
    pub fn hangar(&self, args: &[&str]) -> (i32, String) {
        self.hangar_with(args, &[])
    }

    /// The command `hangar ARGS` against this scenario's plugins, config
    /// and home.
    pub fn command(&self, args: &[&str]) -> Command {
        let config = self.root.path().join("config.toml");
        if !config.exists() {
            self.config("");
        }
        let mut command = Command::new(env!("CARGO_BIN_EXE_hangar"));
        command
            .args(args)
            .arg("--plugins-dir")
            .arg(self.plugins_dir())
            .arg("--config")
            .arg(&config)
            .env("HANGAR_PLATFORM", &self.platform)
            .env("HOME", self.root.path())
            // The pull cache `hangar serve`, `models` and `rm` read: the
            // scenario's own, never this machine's.
            .env("HF_HUB_CACHE", self.root.path().join("hf-cache"))
            .env("XDG_DATA_HOME", self.root.path().join("data"))
            .env("XDG_CONFIG_HOME", self.root.path().join("xdg-config"));
        command
    }

    /// [`Scenario::hangar`] with extra environment variables.
    pub fn hangar_with(&self, args: &[&str], env: &[(&str, PathBuf)]) -> (i32, String) {
        let out = self
            .command(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let root = self.root.path().display().to_string();
        let normalise = |s: &[u8]| String::from_utf8_lossy(s).replace(&root, "$ROOT");
        let stderr = normalise(&out.stderr);
        assert!(
            !stderr.contains("thread 'main' panicked"),
            "hangar panicked:\n{stderr}"
        );
        (
            out.status.code().unwrap_or(-1),
            normalise(&out.stdout) + &stderr,
        )
    }
}

pub fn lib_file(name: &str) -> String {
    format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

pub fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The manifest lines of the SDK's `echo` example beyond the common ones:
/// it generates in process, takes tools (it echoes the prompt, so a prompt
/// holding a tool call's markup is an answer that calls a tool), embeds and
/// reranks. Its code declares the same capabilities, and the host refuses
/// a plugin whose code and manifest disagree.
pub const ECHO_EXTRA: &str = "in_process = true\n[capabilities]\ntool_calls = \">=1.0\"\nembeddings = \">=1.0\"\nrerank = \">=1.0\"\n";

/// A manifest for an example plugin. `extra` is appended verbatim (probe,
/// capabilities, aliases…).
pub fn manifest(id: &str, library: &str, formats: &[&str], priority: i32, extra: &str) -> String {
    let formats: Vec<String> = formats.iter().map(|f| format!("{f:?}")).collect();
    format!(
        r#"id = "{id}"
name = "{id} engine"
version = "0.1.0"
plugin_api = "^1.0"
kind = "native"
artifact = "{library}"
formats = [{}]
priority = {priority}
{extra}
[[platforms]]
os = "linux"
arch = "x86_64"
accelerators = ["cpu", "cuda13"]
"#,
        formats.join(", ")
    )
}
