//! The supervisor: starts engine processes from launch plans, captures
//! their output, waits for readiness, watches them, and stops them with
//! their whole process tree.
//!
//! Every engine runs under a [`keeper`] in a process group of its own, so
//! that stopping it (TERM to the group, a grace period, then KILL) reaches
//! every process it started, and so that nothing survives the host.

pub(crate) mod client;
pub(crate) mod health;
pub(crate) mod keeper;
mod launch;
mod log;
pub(crate) mod ranks;
pub(crate) mod rss;
pub(crate) mod signal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangar_plugin_api::wire::Readiness;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

pub(crate) use launch::{launch, Launch, STOP_GRACE};
pub(crate) use log::EngineLog;

/// How many log lines a session keeps.
const LOG_LINES: usize = 2000;

/// What to start: the program (already allowed by the registry), its
/// arguments and environment.
#[derive(Debug, Clone)]
pub(crate) struct Spawn {
    /// The program's path.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Prefixes of the host's environment variables the engine must not
    /// inherit (those `env` sets excepted).
    pub env_remove_prefixes: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
}

/// How an engine process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The engine's exit code (128 + signal when a signal ended it).
    pub code: Option<i32>,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(c) if c > 128 => write!(f, "killed by signal {}", c - 128),
            Some(c) => write!(f, "exit code {c}"),
            None => f.write_str("an unknown status"),
        }
    }
}

/// A running engine process.
#[derive(Debug)]
pub(crate) struct EngineProcess {
    /// The process group (the keeper's pid).
    pgid: i32,
    /// The engine's own pid, once the keeper reported it.
    engine_pid: watch::Receiver<Option<u32>>,
    /// Set once when the process has exited.
    exit: watch::Receiver<Option<Exit>>,
    /// The engine's output.
    pub log: Arc<EngineLog>,
    /// Held open for the process's lifetime: its closing tells the keeper
    /// that the host is gone.
    _lifeline: ChildStdin,
    /// Set once no process of the group is left, so that `Drop` never
    /// signals a group id the system may have handed to someone else.
    gone: std::sync::atomic::AtomicBool,
}

/// Why an engine did not become ready.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The keeper (and so the engine) could not be spawned.
    #[error("cannot start {program}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// The operating system's error.
        error: String,
    },
    /// The engine exited while starting.
    #[error("the engine exited while starting ({exit}); last output:\n{tail}")]
    Exited {
        /// How it ended.
        exit: Exit,
        /// Its last lines of output.
        tail: String,
    },
    /// The engine did not become ready in time.
    #[error("the engine was not ready after {0:?} (raise its start timeout if the model is large); last output:\n{1}")]
    Timeout(Duration, String),
    /// The engine answered, but said it failed.
    #[error("the engine answered {path} with {status}: {body}; last output:\n{tail}")]
    Failed {
        /// The route.
        path: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
        /// Its last lines of output.
        tail: String,
    },
}

impl EngineProcess {
    /// Starts `spawn` under the keeper `keeper` (the `hangar` binary).
    pub(crate) fn start(keeper: &Path, spawn: &Spawn) -> Result<EngineProcess, StartError> {
        let mut command = Command::new(keeper);
        // The keeper passes its environment on to the engine.
        for (name, _) in std::env::vars_os() {
            let Some(text) = name.to_str() else { continue };
            let listed = spawn
                .env_remove_prefixes
                .iter()
                .any(|p| text.starts_with(p.as_str()));
            if listed && !spawn.env.contains_key(text) {
                command.env_remove(&name);
            }
        }
        command
            .arg("keeper")
            .arg("--")
            .arg(&spawn.program)
            .args(&spawn.args)
            .envs(&spawn.env)
            .current_dir(&spawn.cwd)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| StartError::Spawn {
            program: spawn.program.display().to_string(),
            error: e.to_string(),
        })?;
        let pgid = child.id().expect("a just-spawned child has a pid") as i32;
        let log = Arc::new(EngineLog::new(LOG_LINES));
        let (pid_tx, engine_pid) = watch::channel(None);
        capture(child.stdout.take(), "stdout", log.clone(), None);
        capture(child.stderr.take(), "stderr", log.clone(), Some(pid_tx));
        let lifeline = child.stdin.take().expect("stdin is piped");
        let (exit_tx, exit) = watch::channel(None);
        tokio::spawn(watch_exit(child, exit_tx));
        Ok(EngineProcess {
            pgid,
            engine_pid,
            exit,
            log,
            _lifeline: lifeline,
            gone: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// What the engine's process tree (the keeper and everything below
    /// it) holds in memory now, where `/proc` can tell.
    pub(crate) fn resident_bytes(&self) -> Option<u64> {
        rss::tree_rss(self.pgid as u32)
    }

    /// The process group every local process of the engine runs in.
    pub(crate) fn group(&self) -> i32 {
        self.pgid
    }

    /// The engine's pid, when known.
    pub(crate) fn engine_pid(&self) -> Option<u32> {
        *self.engine_pid.borrow()
    }

    /// How the process ended, if it has.
    pub(crate) fn exit_status(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    /// Resolves when the process has exited.
    pub(crate) async fn exited(&self) -> Exit {
        let mut exit = self.exit.clone();
        loop {
            if let Some(e) = exit.borrow_and_update().clone() {
                return e;
            }
            if exit.changed().await.is_err() {
                return Exit { code: None };
            }
        }
    }

    /// Polls readiness until the engine is ready, exits, or `timeout` ends.
    pub(crate) async fn wait_ready(
        &self,
        client: &reqwest::Client,
        base_url: &str,
        readiness: &Readiness,
        timeout: Duration,
    ) -> Result<(), StartError> {
        let deadline = Instant::now() + timeout;
        let tail = || self.log.tail(20).join("\n");
        loop {
            if let Some(exit) = self.exit_status() {
                return Err(StartError::Exited { exit, tail: tail() });
            }
            if Instant::now() >= deadline {
                return Err(StartError::Timeout(timeout, tail()));
            }
            let health = client
                .get(format!("{base_url}{}", readiness.health_path))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            match health {
                Ok(r) if r.status().as_u16() == readiness.ready_status => break,
                Ok(r) if readiness.failed_statuses.contains(&r.status().as_u16()) => {
                    return Err(failed(&readiness.health_path, r, tail()).await);
                }
                _ => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.exited() => {}
            }
        }
        let Some(warmup) = &readiness.warmup else {
            return Ok(());
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let request = client
            .post(format!("{base_url}{}", warmup.path))
            .json(&warmup.body)
            .timeout(remaining.max(Duration::from_millis(1)))
            .send();
        let response = tokio::select! {
            r = request => r,
            exit = self.exited() => return Err(StartError::Exited { exit, tail: tail() }),
        };
        match response {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(failed(&warmup.path, r, tail()).await),
            Err(e) if e.is_timeout() => Err(StartError::Timeout(timeout, tail())),
            Err(e) => match self.exit_status() {
                Some(exit) => Err(StartError::Exited { exit, tail: tail() }),
                None => Err(StartError::Failed {
                    path: warmup.path.clone(),
                    status: 0,
                    body: e.to_string(),
                    tail: tail(),
                }),
            },
        }
    }

    /// Stops the whole process group: TERM, up to `grace` for it to go,
    /// then KILL. Returns once no process of the group is left.
    pub(crate) async fn stop(&self, grace: Duration) {
        let group = Pid::from_raw(self.pgid);
        if self.is_gone() || killpg(group, Signal::SIGTERM) == Err(Errno::ESRCH) {
            self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.group_is_gone() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = killpg(group, Signal::SIGKILL);
        for _ in 0..100 {
            if self.group_is_gone() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Signal 0 checks existence: ESRCH means no process is left in the
    /// group. A zombie keeper still counts until the exit watcher reaps it.
    fn group_is_gone(&self) -> bool {
        let gone = matches!(killpg(Pid::from_raw(self.pgid), None), Err(Errno::ESRCH));
        if gone {
            self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        gone
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        // Whatever happened before, a dropped engine leaves no process.
        if !self.is_gone() {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
        }
    }
}

/// A readiness answer that means the engine failed, with the start of its
/// body.
async fn failed(path: &str, response: reqwest::Response, tail: String) -> StartError {
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    StartError::Failed {
        path: path.to_string(),
        status,
        body: body.chars().take(300).collect(),
        tail,
    }
}

/// Picks a free loopback port. The port is free when we look; an engine
/// that loses a race for it fails to start with a clear log line.
pub(crate) fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

fn capture(
    pipe: Option<impl AsyncRead + Unpin + Send + 'static>,
    stream: &'static str,
    log: Arc<EngineLog>,
    pid_tx: Option<watch::Sender<Option<u32>>>,
) {
    let Some(pipe) = pipe else { return };
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let (Some(tx), Some(pid)) = (&pid_tx, line.strip_prefix(keeper::PID_LINE)) {
                let _ = tx.send(pid.trim().parse().ok());
                continue;
            }
            tracing::debug!(target: "engine", "{stream}: {line}");
            log.push(stream, &line);
        }
    });
}

async fn watch_exit(mut child: Child, tx: watch::Sender<Option<Exit>>) {
    let code = child.wait().await.ok().and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().or_else(|| s.signal().map(|sig| 128 + sig))
    });
    let _ = tx.send(Some(Exit { code }));
}
