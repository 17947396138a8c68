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

use hangar_plugin_api::manifest::ProbeSpec;
use hangar_plugin_api::wire::ProbeRun;

use crate::config::expand_home;

/// At most this much of each output stream is kept.
const OUTPUT_LIMIT: u64 = 64 * 1024;

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

/// Runs the probe program of `spec`, if it names one.
pub fn run(spec: &ProbeSpec, configured: Option<&str>) -> Option<ProbeRun> {
    let program = spec.program.as_deref()?;
    let path = match find_program(program, configured, &spec.search_paths) {
        Ok(path) => path,
        Err(searched) => return Some(ProbeRun::not_found(searched)),
    };
    let shown = path.display().to_string();
    let mut child = match Command::new(&path)
        .args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return Some(ProbeRun::failed_to_start(shown, e.to_string())),
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + spec.timeout();
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
        return Some(ProbeRun::timed_out(
            shown,
            spec.timeout().as_millis() as u64,
        ));
    };
    Some(ProbeRun::exited(
        shown,
        status.code(),
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    ))
}

/// Reads a pipe to its end on a thread of its own, so that a chatty program
/// never blocks on a full pipe while we wait for it.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let mut limited = pipe.take(OUTPUT_LIMIT);
            let _ = limited.read_to_end(&mut bytes);
            // Keep reading (and discarding) so the child can finish writing.
            let _ = std::io::copy(&mut limited.into_inner(), &mut std::io::sink());
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
