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

/// `hangar plugin new --kind KIND demo` in a work folder of `s`; returns
/// the crate folder.
fn new_plugin(s: &Scenario, kind: &str) -> PathBuf {
    let work = s.root.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (code, out) = s.hangar_with(
        &[
            "plugin",
            "new",
            "--kind",
            kind,
            "demo",
            "--dir",
            work.to_str().unwrap(),
        ],
        &cargo_env(),
    );
    assert_eq!(code, 0, "{out}");
    let demo = work.join("demo");
    assert!(demo.join("src/lib.rs").is_file(), "{out}");
    // The workspace's lock file pins the dependencies to the versions the
    // workspace already compiled (and needs no registry).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap();
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
    let (code, out) = hangar(&["plugin", "install", package.to_str().unwrap()]);
    expect![[r#"
        exit 0
        installed plugin demo 0.1.0 in $ROOT/plugins/demo
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));
    let (code, out) = hangar(&["plugin", "install", package.to_str().unwrap()]);
    expect![[r#"
        exit 1
        error: plugin 'demo' is already installed in $ROOT/plugins/demo; pass --force to replace it
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));
    let (code, out) = hangar(&["plugin", "install", "--force", package.to_str().unwrap()]);
    assert_eq!(
        (code, out.trim()),
        (0, "replaced plugin demo 0.1.0 in $ROOT/plugins/demo")
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

    // The template's own tests: the conformance suite through the test
    // kit, and a capability gate checked through the plugin's ABI.
    let test = cargo(&demo, &["test", "--quiet"]);
    eprintln!("the template's cargo test took {test:.1} s");
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
    let (code, out) = hangar(&["plugin", "install", package.to_str().unwrap()]);
    assert_eq!(
        (code, out.trim()),
        (0, "installed plugin demo 0.1.0 in $ROOT/plugins/demo")
    );
}

#[test]
fn a_plugin_id_must_be_an_id() {
    let s = Scenario::new();
    let (code, out) = s.hangar(&[
        "plugin",
        "new",
        "Demo!",
        "--dir",
        s.root.path().to_str().unwrap(),
    ]);
    expect![[r#"
        exit 1
        error: 'Demo!' is not a plugin id: use lowercase letters, digits and '-', starting with a letter (e.g. 'my-engine')
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));
}
