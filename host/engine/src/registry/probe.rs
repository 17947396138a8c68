//! Runs a manifest's probe program: finds it, runs it under a time limit,
//! and captures what it printed. The plugin's `probe()` interprets the
//! result; the host is the only one that runs programs.
//!
//! The program runs in a process group of its own, and the whole group is
//! killed once the program exits or its time is up: a probe that leaves a
//! child behind (`sh -c "sleep 20 & echo 1.0.0"`) would otherwise hold its
//! output pipes, and so `hangar plugins`, until that child ends.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hangar_plugin_api::manifest::{FlagSurfaceSpec, Manifest, ProbeSpec};
use hangar_plugin_api::wire::{ProbeInput, ProbeRun};

use crate::config::expand_home;

/// At most this much of each output stream of the version run is kept.
const OUTPUT_LIMIT: u64 = 64 * 1024;

/// A surface run may print a large document (mlxcel's
/// `--dump-flag-surface` describes some 300 options).
const SURFACE_OUTPUT_LIMIT: u64 = 1024 * 1024;

/// Finds a program: the operator's configured path first, then `PATH`,
/// then the manifest's usual install locations. Returns the path, or every
/// place that was looked at.
pub fn find_program(
    program: &str,
    configured: Option<&str>,
    search_paths: &[String],
) -> Result<PathBuf, Vec<String>> {
    let mut searched = Vec::new();
    if let Some(configured) = configured {
        let path = expand_home(configured);
        if path.is_file() {
            return Ok(path);
        }
        match which::which(&path) {
            Ok(found) => return Ok(found),
            Err(_) => searched.push(format!("configured {}", path.display())),
        }
    }
    if program.contains('/') {
        let path = expand_home(program);
        if path.is_file() {
            return Ok(path);
        }
        searched.push(path.display().to_string());
        return Err(searched);
    }
    if let Ok(found) = which::which(program) {
        return Ok(found);
    }
    searched.push("PATH".into());
    for dir in search_paths {
        let candidate = expand_home(dir).join(program);
        if candidate.is_file() {
            return Ok(candidate);
        }
        searched.push(candidate.display().to_string());
    }
    Err(searched)
}

/// Everything the plugin of `manifest` is told about its engine: the
/// version run, the surface run, and the operator's plugin `settings`
/// (whose `program` is looked at first).
pub fn input(
    manifest: &Manifest,
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
) -> ProbeInput {
    let configured = settings.get("program").and_then(|v| v.as_str());
    let run = run(&manifest.probe, configured);
    let surface = run_surface(&manifest.probe, &manifest.flag_surface, run.as_ref());
    ProbeInput::new(run)
        .with_surface(surface)
        .with_settings(settings.clone())
}

/// Runs the probe program of `spec`, if it names one.
pub fn run(spec: &ProbeSpec, configured: Option<&str>) -> Option<ProbeRun> {
    let program = spec.program.as_deref()?;
    let path = match find_program(program, configured, &spec.search_paths) {
        Ok(path) => path,
        Err(searched) => return Some(ProbeRun::not_found(searched)),
    };
    Some(run_once(&path, &spec.args, spec.timeout(), OUTPUT_LIMIT))
}

/// Runs the program that the version run found with each argument list of
/// `surface` in turn, under the probe's time limit each, and returns the
/// first run that exited 0, else the last one. Nothing runs when the
/// version run did not find and start the program.
pub fn run_surface(
    spec: &ProbeSpec,
    surface: &FlagSurfaceSpec,
    version_run: Option<&ProbeRun>,
) -> Option<ProbeRun> {
    let Some(ProbeRun::Exited { program, .. }) = version_run.filter(|_| !surface.args.is_empty())
    else {
        return None;
    };
    let path = PathBuf::from(program);
    let mut last = None;
    for args in &surface.args {
        let run = run_once(&path, args, spec.timeout(), SURFACE_OUTPUT_LIMIT);
        if matches!(run, ProbeRun::Exited { code: Some(0), .. }) {
            return Some(run);
        }
        last = Some(run);
    }
    last
}

/// Runs `path` with `args`, killing it (and whatever it started) after
/// `timeout`, and keeps up to `limit` bytes of each output stream.
fn run_once(path: &std::path::Path, args: &[String], timeout: Duration, limit: u64) -> ProbeRun {
    let shown = path.display().to_string();
    let mut child = match Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return ProbeRun::failed_to_start(shown, e.to_string()),
    };
    let stdout = drain(child.stdout.take(), limit);
    let stderr = drain(child.stderr.take(), limit);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => break None,
        }
    };
    // Whatever the program left behind goes with it, so that its pipes
    // close and the drains below end.
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let Some(status) = status else {
        let _ = child.wait();
        return ProbeRun::timed_out(shown, timeout.as_millis() as u64);
    };
    ProbeRun::exited(
        shown,
        status.code(),
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    )
}

/// Reads a pipe to its end on a thread of its own, so that a chatty program
/// never blocks on a full pipe while we wait for it.
fn drain(pipe: Option<impl Read + Send + 'static>, limit: u64) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let mut limited = pipe.take(limit);
            let _ = limited.read_to_end(&mut bytes);
            // Keep reading (and discarding) so the child can finish writing.
            let _ = std::io::copy(&mut limited.into_inner(), &mut std::io::sink());
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A probe program that prints its version, refuses the dump (as a
    /// build without it does) and prints help.
    fn engine(dir: &std::path::Path) -> String {
        let path = dir.join("engine");
        std::fs::write(
            &path,
            "#!/bin/sh\ncase \"$1\" in\n--version) echo 'engine 1.0.0';;\n--dump) echo 'error: unexpected argument' >&2; exit 2;;\n--help) echo '  -c, --ctx-size <N>';;\nesac\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn spec(program: &str) -> ProbeSpec {
        ProbeSpec {
            program: Some(program.into()),
            args: vec!["--version".into()],
            ..ProbeSpec::default()
        }
    }

    fn surface(args: &[&[&str]]) -> FlagSurfaceSpec {
        let mut surface = FlagSurfaceSpec::default();
        surface.args = args
            .iter()
            .map(|a| a.iter().map(|s| s.to_string()).collect())
            .collect();
        surface
    }

    #[test]
    fn the_surface_is_the_first_run_that_succeeds_else_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let program = engine(dir.path());
        let spec = spec(&program);
        let version = run(&spec, None);
        let stdout = |run: Option<ProbeRun>| match run {
            Some(ProbeRun::Exited {
                code,
                stdout,
                stderr,
                ..
            }) => format!("{code:?} {} {}", stdout.trim(), stderr.trim()),
            other => format!("{other:?}"),
        };
        assert_eq!(
            stdout(run_surface(
                &spec,
                &surface(&[&["--dump"], &["--help"]]),
                version.as_ref()
            )),
            "Some(0) -c, --ctx-size <N> "
        );
        assert_eq!(
            stdout(run_surface(
                &spec,
                &surface(&[&["--help"], &["--dump"]]),
                version.as_ref()
            )),
            "Some(0) -c, --ctx-size <N> "
        );
        assert_eq!(
            stdout(run_surface(
                &spec,
                &surface(&[&["--dump"]]),
                version.as_ref()
            )),
            "Some(2)  error: unexpected argument"
        );
        // Nothing is asked for, or the version run found no program.
        assert_eq!(run_surface(&spec, &surface(&[]), version.as_ref()), None);
        let missing = run(&super::tests::spec("/nonexistent/engine"), None);
        assert_eq!(
            run_surface(&spec, &surface(&[&["--help"]]), missing.as_ref()),
            None
        );
    }
}
