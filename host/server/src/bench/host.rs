//! The host a benchmark measures through: `hangar serve` started as a child
//! process on a free loopback port (the very code and path users run, with
//! its own process, so that its memory is its own), and the few calls the
//! benchmark makes to it: management routes and streamed completions.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::report::SpeculationCounts;

/// How long the host may take to bind.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The host's last lines kept for error messages.
const LOG_LINES: usize = 40;

/// A running `hangar serve`.
pub(crate) struct Host {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    client: reqwest::Client,
    log: Arc<Mutex<VecDeque<String>>>,
}

/// One streamed completion, timed.
#[derive(Debug, Clone)]
pub(crate) struct Timed {
    /// Seconds from sending to the first token.
    pub ttft: f64,
    /// Seconds from the first token to the last.
    pub decode: f64,
    /// Tokens generated (the engine's count, or one per streamed chunk).
    pub tokens: u64,
    /// The prompt tokens the engine counted, if it said.
    pub prompt_tokens: Option<u64>,
    /// What speculative decoding did, where the engine speculated.
    pub speculation: Option<SpeculationCounts>,
}

impl Timed {
    /// Tokens per second after the first token (`None` below two tokens).
    pub(crate) fn decode_tps(&self) -> Option<f64> {
        (self.tokens >= 2 && self.decode > 0.0).then(|| (self.tokens - 1) as f64 / self.decode)
    }
}

impl Host {
    /// Starts `exe serve` with `args` and waits for its `serving … on
    /// http://ADDR` line.
    pub(crate) async fn start(
        exe: &std::path::Path,
        args: Vec<OsString>,
        env: Vec<(String, OsString)>,
        unset: &[&str],
    ) -> anyhow::Result<Host> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for k in unset {
            cmd.env_remove(k);
        }
        cmd.envs(env);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} serve", exe.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let log = log.clone();
            tokio::spawn(async move {
                let mut tx = Some(tx);
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(addr) = line
                        .split_once(" on http://")
                        .filter(|_| line.contains("hangar: serving"))
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                    {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(format!("http://{addr}"));
                        }
                    }
                    let mut log = log.lock().expect("log lock");
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let url = match tokio::time::timeout(START_TIMEOUT, rx).await {
            Ok(Ok(url)) => url,
            _ => {
                let _ = child.start_kill();
                let tail = log
                    .lock()
                    .expect("log lock")
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>();
                bail!(
                    "the host did not start serving within {} s; its output:\n{}",
                    START_TIMEOUT.as_secs(),
                    tail.join("\n")
                );
            }
        };
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Host {
            child,
            url,
            client,
            log,
        })
    }

    /// The host's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The host's last lines of output.
    pub(crate) fn log_tail(&self) -> String {
        self.log
            .lock()
            .expect("log lock")
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A management call; a non-2xx answer is an error quoting the host.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .client
            .request(method.clone(), format!("{}{path}", self.url));
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path} on the benchmark's host"))?;
        let status = resp.status();
        let value: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_string);
            bail!("{method} {path} answered {status}: {message}");
        }
        Ok(value)
    }

    /// Streams one completion of `prompt` from `model` and times it.
    pub(crate) async fn complete(
        &self,
        model: &str,
        prompt: &str,
        max_tokens: u32,
        temperature: f64,
    ) -> anyhow::Result<Timed> {
        let body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let sent = Instant::now();
        let resp = self
            .client
            .post(format!("{}/v1/completions", self.url))
            .json(&body)
            .send()
            .await
            .context("POST /v1/completions on the benchmark's host")?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            bail!("POST /v1/completions for {model} answered {status}: {text}");
        }
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        let (mut first, mut last) = (None, None);
        let (mut chunks, mut usage_tokens, mut prompt_tokens) = (0u64, None, None);
        let mut speculation = None;
        'read: while let Some(bytes) = stream.next().await {
            let bytes = bytes.with_context(|| format!("reading {model}'s stream"))?;
            buf.extend_from_slice(&bytes);
            while let Some(at) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=at).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                    continue;
                };
                if data == "[DONE]" {
                    break 'read;
                }
                let event: Value = serde_json::from_str(data).with_context(|| {
                    format!("{model}'s stream sent an event that is not JSON: {data}")
                })?;
                if let Some(message) = event.pointer("/error/message").and_then(Value::as_str) {
                    bail!("{model} failed mid-stream: {message}");
                }
                if event["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    chunks += 1;
                }
                if let Some(u) = event.get("usage").filter(|u| !u.is_null()) {
                    usage_tokens = u["completion_tokens"].as_u64();
                    prompt_tokens = u["prompt_tokens"].as_u64();
                    speculation = speculation_of(u);
                }
            }
        }
        let first = first.ok_or_else(|| anyhow!("{model} answered with no token"))?;
        Ok(Timed {
            ttft: (first - sent).as_secs_f64(),
            decode: (last.unwrap_or(first) - first).as_secs_f64(),
            tokens: usage_tokens.unwrap_or(chunks),
            prompt_tokens,
            speculation,
        })
    }

    /// Stops the host as `hangar serve` is stopped (SIGTERM: it stops its
    /// engines), killing it if it has not exited in 30 s.
    pub(crate) async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The speculation counts of a usage chunk: Hangar's `usage.speculation`,
/// which the host writes only where the engine speculated. Counts of
/// another shape (an engine of its own making) are none, not an error: the
/// answer was still timed.
fn speculation_of(usage: &Value) -> Option<SpeculationCounts> {
    serde_json::from_value(usage.get("speculation")?.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(usage: Value, expected: Expect) {
        expected.assert_eq(&format!("{:?}", speculation_of(&usage)));
    }

    #[test]
    fn usage_chunks_carry_speculation_where_the_engine_speculated() {
        check(
            json!({"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}),
            expect!["None"],
        );
        check(
            json!({
                "completion_tokens": 16,
                "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
                "speculation": {"verifications": 6, "proposed_tokens": 24, "accepted_tokens": 10},
            }),
            expect!["Some(SpeculationCounts { verifications: 6, proposed_tokens: 24, accepted_tokens: 10, time_saved_ms: None })"],
        );
        check(
            json!({"speculation": {"verifications": 6, "proposed_tokens": 24, "accepted_tokens": 10, "time_saved_ms": -35}}),
            expect!["Some(SpeculationCounts { verifications: 6, proposed_tokens: 24, accepted_tokens: 10, time_saved_ms: Some(-35) })"],
        );
        check(json!({"speculation": null}), expect!["None"]);
        check(
            json!({"speculation": {"verifications": "six"}}),
            expect!["None"],
        );
    }
}
