//! `hangar keeper`: the small process that stands between the host and an
//! engine so that no engine outlives the host.
//!
//! The host starts `hangar keeper -- PROGRAM ARGS…` as the leader of a new
//! process group, with a pipe as its standard input. The keeper starts the
//! engine in that same group and waits for it. If the host dies, however it
//! dies (even `kill -9`), the kernel closes the pipe; the keeper reads end of
//! file and kills the whole group, engine and grandchildren included. No
//! `unsafe`, no Linux-only `PR_SET_PDEATHSIG` (which follows the spawning
//! *thread*, not the process), and the same on macOS.
//!
//! The keeper's first line on standard error is `hangar-keeper: engine pid N`,
//! so that the host can report the engine's own pid. It exits with the
//! engine's exit code, or 128 + signal number when a signal ended it.

use std::io::Read;
use std::io::Write;
use std::process::{Command, ExitCode, Stdio};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::getpgrp;

/// The prefix of the keeper's pid line.
pub(crate) const PID_LINE: &str = "hangar-keeper: engine pid ";

/// Runs the keeper; never returns while the engine runs.
pub(crate) fn run(program: &str, args: &[String]) -> ExitCode {
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("hangar-keeper: cannot start {program}: {e}");
            return ExitCode::from(127);
        }
    };
    // One write: the engine, started just now, shares this stderr, and
    // `eprintln!` writes its pieces one by one (stderr is unbuffered), so
    // an engine line could land inside the pid line and both be lost (seen:
    // "unsupported model architecture" vanished from a failed start's
    // output under load). A pipe takes a write this short whole.
    let line = format!("{PID_LINE}{}\n", child.id());
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::thread::spawn(|| {
        // Blocks until the host closes the pipe, which happens only when it
        // exits: then nothing may survive it.
        let _ = std::io::copy(
            &mut std::io::stdin().lock().take(u64::MAX),
            &mut std::io::sink(),
        );
        let _ = killpg(getpgrp(), Signal::SIGKILL);
    });
    match child.wait() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            let code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1);
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Err(e) => {
            eprintln!("hangar-keeper: lost the engine: {e}");
            ExitCode::from(1)
        }
    }
}
