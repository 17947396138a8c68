//! `hangar plugin new|check|pack|install`, start to finish, as a plugin
//! author runs them: the template's crate builds, passes the conformance
//! suite (its own `cargo test` and `hangar plugin check`), packs into one
//! file, installs into a plugins dir, and `hangar plugins` lists it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use expect_test::expect;

use crate::fixtures::{cargo_env, Scenario};

/// Runs cargo in `dir` like an author would, with the workspace's target
/// dir so the SDK and its dependencies are not compiled again.
fn cargo(dir: &Path, args: &[&str]) -> f64 {
    let started = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .envs(cargo_env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {} failed:\n{}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed().as_secs_f64()
}

/// `hangar plugin new --kind KIND WORK/demo` in a work folder of `s`,
/// depending on this checkout's SDK; returns the crate folder.
fn new_plugin(s: &Scenario, kind: &str) -> PathBuf {
    let work = s.root.path().join("work");
    let demo = work.join("demo");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap();
    let (code, out) = s.hangar_with(
        &[
            "plugin",
            "new",
            "--kind",
            kind,
            demo.to_str().unwrap(),
            "--sdk-path",
            root.join("sdk").to_str().unwrap(),
        ],
        &cargo_env(),
    );
    assert_eq!(code, 0, "{out}");
    assert!(demo.join("src/lib.rs").is_file(), "{out}");
    // The crate builds on another machine: no absolute path of this one.
    let cargo_toml = std::fs::read_to_string(demo.join("Cargo.toml")).unwrap();
    assert!(
        cargo_toml.contains("hangar-sdk = { path = \"../") && !cargo_toml.contains("path = \"/"),
        "{cargo_toml}"
    );
    // The workspace's lock file pins the dependencies to the versions the
    // workspace already compiled (and needs no registry).
    std::fs::copy(root.join("Cargo.lock"), demo.join("Cargo.lock")).unwrap();
    demo
}

#[test]
fn a_new_native_plugin_builds_passes_packs_installs_and_is_listed() {
    let s = Scenario::new();
    let hangar = |args: &[&str]| s.hangar_with(args, &cargo_env());
    let demo = new_plugin(&s, "native");
    let build = cargo(&demo, &["build", "--quiet"]);
    eprintln!("the template's plugin built in {build:.1} s");

    let (code, out) = hangar(&["plugin", "check", demo.to_str().unwrap(), "--debug"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("8 passed, 0 failed, 5 skipped"), "{out}");
    // Without its engine the suite passes, and says what it did not test.
    expect![[r#"note: the engine was not found (looked in PATH, $ROOT/.local/bin/demo-server), so probe() never read its output: its version parsing was not exercised. Install the engine, or point it at one with `program = "/path"` under `[plugins.demo]` in config.toml (PluginTest::with_settings in tests), and run the suite again"#]].assert_eq(
        out.lines()
            .filter(|l| l.starts_with("note:"))
            .collect::<Vec<_>>()
            .join("\n")
            .as_str(),
    );

    let package = s.root.path().join("demo.tar.gz");
    let (code, out) = hangar(&[
        "plugin",
        "pack",
        demo.to_str().unwrap(),
        "--debug",
        "-o",
        package.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    // Without a terminal to ask on, install wants --yes; it lists the
    // programs the plugin may run either way.
    let (code, out) = hangar(&["plugin", "install", package.to_str().unwrap()]);
    expect![[r#"
        exit 1
        plugin demo 0.1.0 (native code: it runs in the host (or its worker) with your user's permissions)
          programs it may have the host run:
            demo-server (probe)
        error: plugin 'demo' was not installed: stdin is not a terminal to ask on; pass --yes to install it
    "#]].assert_eq(&format!("exit {code}\n{out}"));
    let (code, out) = hangar(&["plugin", "install", "--yes", package.to_str().unwrap()]);
    expect![[r#"
        exit 0
        installed plugin demo 0.1.0 in $ROOT/plugins/demo
        plugin demo 0.1.0 (native code: it runs in the host (or its worker) with your user's permissions)
          programs it may have the host run:
            demo-server (probe)
    "#]].assert_eq(&format!("exit {code}\n{out}"));
    let (code, out) = hangar(&["plugin", "install", "-y", package.to_str().unwrap()]);
    expect![[r#"
        exit 1
        plugin demo 0.1.0 (native code: it runs in the host (or its worker) with your user's permissions)
          programs it may have the host run:
            demo-server (probe)
        error: plugin 'demo' is already installed in $ROOT/plugins/demo; pass --force to replace it
    "#]].assert_eq(&format!("exit {code}\n{out}"));
    let (code, out) = hangar(&[
        "plugin",
        "install",
        "--force",
        "--yes",
        package.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("replaced plugin demo 0.1.0 in $ROOT/plugins/demo"),
        "{out}"
    );

    let (code, out) = hangar(&["plugins"]);
    expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS       FORMATS  PLATFORMS                                               PRIORITY  ENGINE  CAPABILITIES 
         demo    unavailable  gguf     linux/x86_64/cpu linux/aarch64/cpu macos/aarch64/metal  10                             
        - demo ($ROOT/plugins/demo): not installed (looked in PATH, $ROOT/.local/bin/demo-server)
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));

    // The installed folder passes as it is, and once its engine is
    // installed the plugin is ready with the capability its version has.
    let installed = s.plugins_dir().join("demo");
    let (code, out) = hangar(&["plugin", "check", installed.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let bin = s.root.path().join(".local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::rename(
        s.engine_program("demo-server", "demo-server 1.1.0"),
        bin.join("demo-server"),
    )
    .unwrap();
    let (code, out) = hangar(&["plugins"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("demo    ready   gguf") && out.contains("1.1.0   prompt_cache"),
        "{out}"
    );
    let (code, out) = hangar(&["plugin", "check", installed.to_str().unwrap()]);
    assert!(
        code == 0 && out.contains("available, engine 1.1.0") && !out.contains("note:"),
        "{out}"
    );

    // The template's own tests: the conformance suite through the test
    // kit, and a capability gate checked through the plugin's ABI.
    let test = cargo(&demo, &["test", "--quiet"]);
    eprintln!("the template's cargo test took {test:.1} s");

    // The same crate ships as a WebAssembly plugin too.
    let (code, out) = hangar(&[
        "plugin",
        "check",
        "--kind",
        "wasm",
        demo.to_str().unwrap(),
        "--debug",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("demo 0.1.0 (wasm) serves [gguf]")
            && out.contains("hangar_plugin_demo.wasm loads"),
        "{out}"
    );
    let wasm_package = s.root.path().join("demo-wasm.tar.gz");
    let (code, out) = hangar(&[
        "plugin",
        "pack",
        "--kind",
        "wasm",
        demo.to_str().unwrap(),
        "--debug",
        "-o",
        wasm_package.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = hangar(&[
        "plugin",
        "install",
        "--force",
        "--yes",
        wasm_package.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    let manifest = std::fs::read_to_string(installed.join("plugin.toml")).unwrap();
    assert!(manifest.contains("kind = \"wasm\""), "{manifest}");
    assert!(installed.join("hangar_plugin_demo.wasm").is_file());
    let (code, out) = hangar(&["plugins"]);
    assert!(code == 0 && out.contains("demo    ready   gguf"), "{out}");
    // A built folder is one kind.
    let (code, out) = hangar(&[
        "plugin",
        "check",
        "--kind",
        "native",
        installed.to_str().unwrap(),
    ]);
    expect![[r#"
        exit 1
        error: $ROOT/plugins/demo is a built wasm plugin folder; to check or pack the native plugin, give the crate's folder with --kind native
    "#]].assert_eq(&format!("exit {code}\n{out}"));
}

#[test]
fn a_new_wasm_plugin_builds_and_is_listed_from_a_plain_folder() {
    let s = Scenario::new();
    let hangar = |args: &[&str]| s.hangar_with(args, &cargo_env());
    let demo = new_plugin(&s, "wasm");

    // Build as the template's README says, and drop a folder of the
    // manifest and the module into the plugins dir by hand.
    let build = cargo(
        &demo,
        &["build", "--quiet", "--target", "wasm32-unknown-unknown"],
    );
    eprintln!("the wasm template's plugin built in {build:.1} s");
    let built =
        crate::fixtures::target_dir().join("wasm32-unknown-unknown/debug/hangar_plugin_demo.wasm");
    let folder = s.plugins_dir().join("demo");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(demo.join("plugin.toml"), folder.join("plugin.toml")).unwrap();
    std::fs::copy(&built, folder.join("hangar_plugin_demo.wasm")).unwrap();
    let (code, out) = hangar(&["plugins"]);
    expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS       FORMATS  PLATFORMS                                               PRIORITY  ENGINE  CAPABILITIES 
         demo    unavailable  gguf     linux/x86_64/cpu linux/aarch64/cpu macos/aarch64/metal  10                             
        - demo ($ROOT/plugins/demo): not installed (looked in PATH, $ROOT/.local/bin/demo-server)
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));

    // With its engine installed it is ready, its capability gated on.
    let bin = s.root.path().join(".local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::rename(
        s.engine_program("demo-server", "demo-server 1.1.0"),
        bin.join("demo-server"),
    )
    .unwrap();
    let (code, out) = hangar(&["plugins"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("demo    ready   gguf") && out.contains("1.1.0   prompt_cache"),
        "{out}"
    );

    // The crate passes the conformance suite, packs into one file, and
    // installs.
    let package = s.root.path().join("demo-0.1.0-wasm.tar.gz");
    let (code, out) = hangar(&["plugin", "check", demo.to_str().unwrap(), "--debug"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("8 passed, 0 failed, 5 skipped"), "{out}");
    let (code, out) = hangar(&[
        "plugin",
        "pack",
        demo.to_str().unwrap(),
        "--debug",
        "-o",
        package.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    std::fs::remove_dir_all(&folder).unwrap();
    let (code, out) = hangar(&["plugin", "install", "--yes", package.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("installed plugin demo 0.1.0 in $ROOT/plugins/demo"),
        "{out}"
    );
}

#[test]
fn the_plugin_id_is_the_folders_name_or_id() {
    let s = Scenario::new();
    let root = s.root.path();
    let (code, out) = s.hangar(&["plugin", "new", root.join("Demo!").to_str().unwrap()]);
    expect![[r#"
        exit 1
        error: 'Demo!' is not a plugin id: use lowercase letters, digits and '-', starting with a letter (e.g. 'my-engine'); the id defaults to the folder's name, --id sets another
    "#]].assert_eq(&format!("exit {code}\n{out}"));

    // --sdk-path must be a checkout's sdk/ folder.
    let (code, out) = s.hangar(&[
        "plugin",
        "new",
        root.join("demo").to_str().unwrap(),
        "--sdk-path",
        root.to_str().unwrap(),
    ]);
    expect![[r#"
        exit 1
        error: $ROOT is not a Hangar checkout's sdk/ folder (it has no testkit/Cargo.toml)
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));

    let dir = root.join("engines/some-dir");
    let (code, out) = s.hangar(&[
        "plugin",
        "new",
        "--kind",
        "native",
        "--id",
        "my-engine",
        dir.to_str().unwrap(),
        "--crates-io",
    ]);
    assert_eq!(code, 0, "{out}");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let lines = |text: String, keys: &[&str]| -> Vec<String> {
        text.lines()
            .filter(|l| keys.iter().any(|k| l.starts_with(k)))
            .map(str::to_string)
            .collect()
    };
    let mut seen = lines(read("Cargo.toml"), &["name", "hangar-sdk"]);
    seen.extend(lines(read("plugin.toml"), &["id", "artifact", "programs"]));
    expect![[r#"
        [
            "name = \"hangar-plugin-my-engine\"",
            "name = \"hangar_plugin_my_engine\"",
            "hangar-sdk = { version = \"0.1.0\" }",
            "hangar-sdk-testkit = { version = \"0.1.0\" }",
            "id = \"my-engine\"",
            "artifact = \"hangar_plugin_my_engine\"",
            "programs = [\"my-engine-server\"]",
        ]
    "#]]
    .assert_debug_eq(&seen);
}
