//! The programs a plugin may have the host run, written once for the probe,
//! launch plans of native and WebAssembly plugins, the conformance suite and
//! `hangar plugin install`.
//!
//! A plugin never runs anything itself: it names programs in `plugin.toml`
//! (`[probe] program` and `programs`), and its launch plans pick one of them
//! (or the path the probe resolved). That keeps a sandboxed WebAssembly
//! plugin sandboxed only while the programs it names run fixed code. A
//! shell or an interpreter runs whatever the plugin hands it in its
//! arguments (`/bin/sh -c …`, `python3 -c …`), so naming one is refused
//! unless the operator allowed it for that plugin in `config.toml`:
//!
//! ```toml
//! [plugins.mlx-lm]
//! allow_programs = ["python3"]
//! ```
//!
//! The rule looks at the names `plugin.toml` gives (their last path
//! component, without a version suffix: `/usr/bin/python3.12` is `python`),
//! not at what a name resolves to on this machine: the operator's own
//! `program = "/path"` setting is the operator's choice.

use std::collections::BTreeMap;

use hangar_plugin_api::Manifest;
use serde_json::Value;

pub use crate::config::ALLOW_PROGRAMS;

/// Programs that run whatever code or command they are handed: shells,
/// language interpreters, and launchers that run another program named in
/// their arguments. Matched against a program's base name, lowercased,
/// without `.exe` and without a trailing version (`python3.12` → `python`).
pub const INTERPRETERS: &[&str] = &[
    // shells
    "sh",
    "bash",
    "zsh",
    "dash",
    "ash",
    "ksh",
    "mksh",
    "csh",
    "tcsh",
    "fish",
    "yash",
    "elvish",
    "nu",
    "xonsh",
    "pwsh",
    "powershell",
    "cmd",
    "busybox",
    "toybox",
    // interpreters
    "python",
    "pypy",
    "node",
    "nodejs",
    "deno",
    "bun",
    "perl",
    "ruby",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "expect",
    "rscript",
    "julia",
    "osascript",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "java",
    "jshell",
    // launchers of another program
    "env",
    "xargs",
    "nohup",
    "nice",
    "ionice",
    "timeout",
    "setsid",
    "stdbuf",
    "taskset",
    "chrt",
    "sudo",
    "doas",
    "su",
    "runuser",
    "chroot",
    "unshare",
    "nsenter",
    "flock",
    "script",
    "watch",
    "time",
    "strace",
    "ltrace",
    "gdb",
    "valgrind",
    "ssh",
    "npx",
    "bunx",
    "uv",
    "uvx",
    "pipx",
];

/// Whether `program` (a name or a path) is a shell, an interpreter or a
/// launcher of other programs ([`INTERPRETERS`]).
pub fn is_interpreter(program: &str) -> bool {
    INTERPRETERS.contains(&family(program).as_str())
}

/// `program`'s base name, lowercased, without `.exe` and a version suffix.
fn family(program: &str) -> String {
    let name = base_name(program).to_ascii_lowercase();
    let name = name.strip_suffix(".exe").unwrap_or(&name);
    name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-')
        .to_string()
}

fn base_name(program: &str) -> &str {
    program.rsplit(['/', '\\']).next().unwrap_or(program)
}

/// The programs the operator allows plugin settings `settings` (its
/// `[plugins.<id>]` table) to run beyond the rule: `allow_programs`.
/// `Config::parse` has already refused a value that is not a list of
/// strings.
pub fn allowed(settings: &BTreeMap<String, Value>) -> Vec<String> {
    settings
        .get(ALLOW_PROGRAMS)
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One program `plugin.toml` names, as `hangar plugin install` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeclaredProgram {
    /// The name or path as `plugin.toml` gives it.
    pub program: String,
    /// `probe` for `[probe] program`, `programs` for the list.
    pub declared_in: &'static str,
    /// A shell, interpreter or launcher ([`is_interpreter`]).
    pub interpreter: bool,
    /// Whether the host runs it: not an interpreter, or one the operator
    /// allowed.
    pub allowed: bool,
}

/// Every program `manifest` names, with whether the host would run it under
/// the plugin settings `settings`.
pub fn declared(manifest: &Manifest, settings: &BTreeMap<String, Value>) -> Vec<DeclaredProgram> {
    let allowed = allowed(settings);
    let probe = manifest.probe.program.iter().map(|p| (p, "probe"));
    let listed = manifest.programs.iter().map(|p| (p, "programs"));
    let mut seen = Vec::new();
    probe
        .chain(listed)
        .filter(|(p, _)| {
            let new = !seen.contains(p);
            seen.push(*p);
            new
        })
        .map(|(program, declared_in)| {
            let interpreter = is_interpreter(program);
            DeclaredProgram {
                program: program.clone(),
                declared_in,
                interpreter,
                allowed: !interpreter || allows(&allowed, program),
            }
        })
        .collect()
}

/// Whether the operator's list `allowed` names `program` (as written, or by
/// base name: `allow_programs = ["sh"]` allows `/bin/sh`).
fn allows(allowed: &[String], program: &str) -> bool {
    allowed
        .iter()
        .any(|a| a == program || base_name(a) == base_name(program))
}

/// Why the host refuses plugin `manifest` under its settings `settings`:
/// it names a shell or interpreter the operator did not allow. The
/// sentence ends with the exact `config.toml` line that allows them.
pub fn refused_interpreters(
    manifest: &Manifest,
    settings: &BTreeMap<String, Value>,
) -> Option<String> {
    let refused: Vec<String> = declared(manifest, settings)
        .into_iter()
        .filter(|p| !p.allowed)
        .map(|p| p.program)
        .collect();
    if refused.is_empty() {
        return None;
    }
    let quoted = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut line = allowed(settings);
    line.extend(refused.iter().cloned());
    Some(format!(
        "plugin.toml names {} as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `{ALLOW_PROGRAMS} = {line:?}` under `[plugins.{}]` in config.toml",
        quoted(&refused),
        manifest.id
    ))
}

/// The host's one rule for the program of a launch plan: the program the
/// probe resolved (`probed`), or a program `plugin.toml` declares, and a
/// shell or interpreter among them only where the operator allowed it
/// (`settings`: the plugin's `[plugins.<id>]` table). Returns the refusal
/// (`names program 'x', which plugin.toml does not declare (declared: …)`)
/// for anything else.
pub fn undeclared_program(
    manifest: &Manifest,
    settings: &BTreeMap<String, Value>,
    probed: Option<&str>,
    program: &str,
) -> Option<String> {
    // The name plugin.toml gives the program the plan runs.
    let declared_as = match probed {
        Some(probed) if probed == program => manifest.probe.program.as_deref(),
        _ => manifest.allowed_programs().find(|p| *p == program),
    };
    match declared_as {
        Some(name) if is_interpreter(name) && !allows(&allowed(settings), name) => Some(format!(
            "names program '{program}', a shell or interpreter the operator has not allowed for plugin '{id}' (add `{ALLOW_PROGRAMS} = [\"{name}\"]` under `[plugins.{id}]` in config.toml)",
            id = manifest.id
        )),
        Some(_) => None,
        // A plugin without a probe program (in-process) may still plan the
        // probe's path when the host handed it one.
        None if probed == Some(program) => None,
        None => {
            let mut declared: Vec<&str> = Vec::new();
            for p in manifest.allowed_programs() {
                if !declared.contains(&p) {
                    declared.push(p);
                }
            }
            Some(format!(
                "names program '{program}', which plugin.toml does not declare (declared: {}) and the probe did not resolve; declare it in `programs`, or plan the probe's program",
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.join(", ")
                }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each program of a manifest's `programs` and `[probe] program`, with
    /// the settings' `allow_programs`: what the host says about it.
    fn check(probe: &str, programs: &[&str], allow: &[&str], expect: expect_test::Expect) {
        let text = format!(
            r#"
id = "p"
name = "p"
version = "0.1.0"
plugin_api = "^1.0"
kind = "native"
artifact = "p"
formats = ["gguf"]
programs = {programs:?}
[[platforms]]
os = "linux"
arch = "x86_64"
accelerators = ["cpu"]
[probe]
program = "{probe}"
"#
        );
        let manifest = Manifest::parse(&text).expect("a valid manifest");
        let settings: BTreeMap<String, Value> =
            [(ALLOW_PROGRAMS.to_string(), serde_json::json!(allow))].into();
        let mut out = Vec::new();
        for p in declared(&manifest, &settings) {
            out.push(format!(
                "{} ({}): {}{}",
                p.program,
                p.declared_in,
                if p.interpreter { "interpreter, " } else { "" },
                if p.allowed { "runs" } else { "refused" }
            ));
        }
        out.push(format!(
            "plugin: {}",
            refused_interpreters(&manifest, &settings).unwrap_or_else(|| "accepted".into())
        ));
        for (probed, program) in [
            (Some("/usr/bin/python3"), "/usr/bin/python3"),
            (None, "/bin/sh"),
            (None, "engine"),
        ] {
            out.push(format!(
                "plan {program}: {}",
                undeclared_program(&manifest, &settings, probed, program)
                    .unwrap_or_else(|| "runs".into())
            ));
        }
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn an_engine_program_runs_without_allowance() {
        check(
            "engine",
            &["engine"],
            &[],
            expect_test::expect![[r#"
            engine (probe): runs
            plugin: accepted
            plan /usr/bin/python3: runs
            plan /bin/sh: names program '/bin/sh', which plugin.toml does not declare (declared: engine) and the probe did not resolve; declare it in `programs`, or plan the probe's program
            plan engine: runs"#]],
        );
    }

    #[test]
    fn a_shell_is_refused_until_allowed() {
        check(
            "engine",
            &["engine", "/bin/sh"],
            &[],
            expect_test::expect![[r#"
            engine (probe): runs
            /bin/sh (programs): interpreter, refused
            plugin: plugin.toml names '/bin/sh' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = ["/bin/sh"]` under `[plugins.p]` in config.toml
            plan /usr/bin/python3: runs
            plan /bin/sh: names program '/bin/sh', a shell or interpreter the operator has not allowed for plugin 'p' (add `allow_programs = ["/bin/sh"]` under `[plugins.p]` in config.toml)
            plan engine: runs"#]],
        );
        check(
            "engine",
            &["engine", "/bin/sh"],
            &["sh"],
            expect_test::expect![[r#"
            engine (probe): runs
            /bin/sh (programs): interpreter, runs
            plugin: accepted
            plan /usr/bin/python3: runs
            plan /bin/sh: runs
            plan engine: runs"#]],
        );
    }

    #[test]
    fn an_interpreter_probe_is_refused_until_allowed() {
        check(
            "python3",
            &["python3"],
            &[],
            expect_test::expect![[r#"
            python3 (probe): interpreter, refused
            plugin: plugin.toml names 'python3' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = ["python3"]` under `[plugins.p]` in config.toml
            plan /usr/bin/python3: names program '/usr/bin/python3', a shell or interpreter the operator has not allowed for plugin 'p' (add `allow_programs = ["python3"]` under `[plugins.p]` in config.toml)
            plan /bin/sh: names program '/bin/sh', which plugin.toml does not declare (declared: python3) and the probe did not resolve; declare it in `programs`, or plan the probe's program
            plan engine: names program 'engine', which plugin.toml does not declare (declared: python3) and the probe did not resolve; declare it in `programs`, or plan the probe's program"#]],
        );
        check(
            "python3",
            &["python3"],
            &["python3"],
            expect_test::expect![[r#"
            python3 (probe): interpreter, runs
            plugin: accepted
            plan /usr/bin/python3: runs
            plan /bin/sh: names program '/bin/sh', which plugin.toml does not declare (declared: python3) and the probe did not resolve; declare it in `programs`, or plan the probe's program
            plan engine: names program 'engine', which plugin.toml does not declare (declared: python3) and the probe did not resolve; declare it in `programs`, or plan the probe's program"#]],
        );
    }

    #[test]
    fn interpreters_are_known_by_family() {
        let names = [
            "python3.12",
            "/usr/bin/env",
            "BASH.EXE",
            "node",
            "perl5.36",
            "pwsh",
            "zsh",
            "llama-server",
            "mlxcel-server",
            "python3-config",
            "shell-engine",
            "envoy",
        ];
        let seen: Vec<String> = names
            .iter()
            .map(|n| format!("{n}: {}", is_interpreter(n)))
            .collect();
        expect_test::expect![[r#"
            python3.12: true
            /usr/bin/env: true
            BASH.EXE: true
            node: true
            perl5.36: true
            pwsh: true
            zsh: true
            llama-server: false
            mlxcel-server: false
            python3-config: false
            shell-engine: false
            envoy: false"#]]
        .assert_eq(&seen.join("\n"));
    }
}
