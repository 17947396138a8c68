//! The suite's end-to-end check: start the engine the plugin plans for the
//! fixture, wait until it is ready, and send one chat request, streamed and
//! not, over a small blocking HTTP/1.1 client on `std::net` (the engine
//! library has no HTTP stack of its own, and needs none for one request).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangar_plugin_api::wire::{LaunchPlan, LoadRequest};
use serde_json::{json, Value};

/// A free loopback port for the engine (the small race between closing
/// the listener and the engine binding it is the host's too).
pub(super) fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free loopback port: {e}"))
}

/// An engine process, killed when dropped.
struct Engine {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Engine {
    /// The last lines the engine printed, for a verdict.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            "it printed nothing".into()
        } else {
            format!("its last output: {tail}")
        }
    }
}

/// Serves the fixture with `plan` and checks one chat request, streamed
/// and not. Returns what was seen, or what went wrong.
pub(super) fn serve(
    request: &LoadRequest,
    plan: &LaunchPlan,
    limit: Duration,
    answer_limit: Duration,
) -> Result<String, String> {
    let work = Path::new(&request.work_dir);
    for (name, content) in &plan.files {
        std::fs::write(work.join(name), content)
            .map_err(|e| format!("cannot write the plan's file {name}: {e}"))?;
    }
    let log = work.join("engine.log");
    let out =
        std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot share {}: {e}", log.display()))?;
    let mut command = Command::new(&plan.program);
    command
        .args(&plan.args)
        .envs(&plan.env)
        .current_dir(plan.cwd.as_deref().unwrap_or(&request.work_dir))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", plan.program))?;
    let mut engine = Engine { child, log };
    let address = format!("{}:{}", request.host, request.port);
    let started = Instant::now();
    let limit = limit.min(Duration::from_millis(plan.start_timeout_ms));
    loop {
        if let Ok(Some(status)) = engine.child.try_wait() {
            return Err(format!(
                "the engine exited ({status}) before it was ready; {}",
                engine.tail()
            ));
        }
        match http(
            &address,
            "GET",
            &plan.readiness.health_path,
            None,
            Duration::from_secs(2),
        ) {
            Ok((status, _)) if status == plan.readiness.ready_status => break,
            Ok((status, _)) if plan.readiness.failed_statuses.contains(&status) => {
                return Err(format!(
                    "GET {} answered {status}, which the plan calls a failed load; {}",
                    plan.readiness.health_path,
                    engine.tail()
                ))
            }
            _ if started.elapsed() > limit => {
                return Err(format!(
                    "GET {} did not answer {} within {} s; {}",
                    plan.readiness.health_path,
                    plan.readiness.ready_status,
                    limit.as_secs(),
                    engine.tail()
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let ready_ms = started.elapsed().as_millis();
    let model = plan
        .upstream_model
        .clone()
        .unwrap_or_else(|| request.model_id.clone());
    let body = |stream: bool| {
        json!({
            "model": model,
            "messages": [{"role": "user", "content": "Hello! Say something short."}],
            "max_tokens": 8,
            "stream": stream,
        })
        .to_string()
    };
    let path = "/v1/chat/completions";
    let (status, answer) = http(&address, "POST", path, Some(&body(false)), answer_limit)?;
    let text = check_completion(status, &answer).map_err(|e| format!("POST {path}: {e}"))?;
    let (status, answer) = http(&address, "POST", path, Some(&body(true)), answer_limit)?;
    let chunks = check_stream(status, &answer).map_err(|e| format!("POST {path} (stream): {e}"))?;
    Ok(format!(
        "`{}` ready in {ready_ms} ms; chat answered {} and streamed {chunks} chunks ending in [DONE]",
        plan.program,
        serde_json::to_string(&shorten(&text, 40)).unwrap_or_default()
    ))
}

fn shorten(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The message content of an OpenAI chat completion, or why `answer` is not one.
fn check_completion(status: u16, answer: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(answer);
    if status != 200 {
        return Err(format!("answered {status}: {}", shorten(&text, 200)));
    }
    let value: Value = serde_json::from_slice(answer).map_err(|e| {
        format!(
            "answered something that is not JSON ({e}): {}",
            shorten(&text, 200)
        )
    })?;
    if value["object"] != "chat.completion" {
        return Err(format!(
            "`object` is {}, not \"chat.completion\"",
            value["object"]
        ));
    }
    let choice = &value["choices"][0];
    if choice["message"]["role"] != "assistant" || !choice["finish_reason"].is_string() {
        return Err(format!(
            "choices[0] has no assistant message with a finish_reason: {}",
            shorten(&choice.to_string(), 200)
        ));
    }
    choice["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "choices[0].message.content is not a string".into())
}

/// The number of `chat.completion.chunk` events of an OpenAI stream, or why
/// `answer` is not one.
fn check_stream(status: u16, answer: &[u8]) -> Result<usize, String> {
    let text = String::from_utf8_lossy(answer);
    if status != 200 {
        return Err(format!("answered {status}: {}", shorten(&text, 200)));
    }
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .collect();
    if events.last() != Some(&"[DONE]") {
        return Err(format!(
            "the stream does not end with `data: [DONE]`: {}",
            shorten(&text, 200)
        ));
    }
    let chunks = &events[..events.len() - 1];
    for chunk in chunks {
        let value: Value = serde_json::from_str(chunk)
            .map_err(|e| format!("an event is not JSON ({e}): {}", shorten(chunk, 200)))?;
        if value["object"] != "chat.completion.chunk" || !value["choices"].is_array() {
            return Err(format!(
                "an event is not a chat.completion.chunk with choices: {}",
                shorten(chunk, 200)
            ));
        }
    }
    if chunks.is_empty() {
        return Err("the stream holds no chunk before [DONE]".into());
    }
    Ok(chunks.len())
}

/// One HTTP/1.1 request (`Connection: close`): the status and the body,
/// chunked transfer decoded.
fn http(
    address: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let fail = |e: std::io::Error| format!("{method} {path} on {address}: {e}");
    let mut stream = TcpStream::connect(address).map_err(fail)?;
    stream.set_read_timeout(Some(limit)).map_err(fail)?;
    stream.set_write_timeout(Some(limit)).map_err(fail)?;
    let body = body.unwrap_or_default();
    // One write: `write!` on the socket would send each piece on its own.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(fail)?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(fail)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| {
            format!(
                "{method} {path}: '{}' is not an HTTP status line",
                line.trim()
            )
        })?;
    let mut chunked = false;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(fail)?;
        let header = line.trim();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).map_err(fail)?;
    if !chunked {
        return Ok((status, raw));
    }
    let mut body = Vec::new();
    let mut rest = raw.as_slice();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .ok_or_else(|| format!("{method} {path}: a malformed chunk size"))?;
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpListener;

    use super::*;

    /// Answers one connection with `raw` and returns what `http` made of it.
    fn exchange(raw: &'static str) -> Result<(u16, String), String> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            // Read the whole request (headers, then the body `{}`): closing
            // with bytes unread resets the connection, and the client may
            // send the body in a write of its own.
            let (mut request, mut buf) = (Vec::new(), [0u8; 1024]);
            while !request.ends_with(b"\r\n\r\n{}") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            stream.write_all(raw.as_bytes()).unwrap();
        });
        let answer = http(
            &address,
            "POST",
            "/v1/chat/completions",
            Some("{}"),
            Duration::from_secs(5),
        );
        server.join().unwrap();
        answer.map(|(status, body)| (status, String::from_utf8(body).unwrap()))
    }

    #[test]
    fn the_client_reads_plain_and_chunked_bodies() {
        assert_eq!(
            exchange("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":1}"),
            Ok((200, "{\"a\":1}".into()))
        );
        assert_eq!(
            exchange("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n9;ext=1\r\n [DONE]\n\n\r\n0\r\n\r\n"),
            Ok((200, "data: [DONE]\n\n".into()))
        );
        assert_eq!(
            exchange("HTTP/1.1 503 Busy\r\n\r\n"),
            Ok((503, String::new()))
        );
        assert!(exchange("SSH-2.0-OpenSSH\r\n")
            .unwrap_err()
            .contains("is not an HTTP status line"));
    }

    #[test]
    fn answers_must_be_openai_shaped() {
        let completion = |body: &str| check_completion(200, body.as_bytes());
        assert_eq!(
            completion(
                r#"{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#
            ),
            Ok("hi".into())
        );
        assert_eq!(
            completion(r#"{"object":"text_completion","choices":[]}"#),
            Err(r#"`object` is "text_completion", not "chat.completion""#.into())
        );
        assert!(completion("<html>")
            .unwrap_err()
            .starts_with("answered something that is not JSON"));
        assert_eq!(
            check_completion(500, b"boom"),
            Err("answered 500: boom".into())
        );
        let chunk = r#"{"object":"chat.completion.chunk","choices":[{"delta":{"content":"hi"}}]}"#;
        let stream = |text: String| check_stream(200, text.as_bytes());
        assert_eq!(stream(format!("data: {chunk}\n\ndata: [DONE]\n\n")), Ok(1));
        assert!(stream(format!("data: {chunk}\n\n"))
            .unwrap_err()
            .contains("does not end with `data: [DONE]`"));
        assert_eq!(
            stream("data: [DONE]\n\n".into()),
            Err("the stream holds no chunk before [DONE]".into())
        );
        assert!(stream("data: {}\n\ndata: [DONE]\n\n".into())
            .unwrap_err()
            .starts_with("an event is not a chat.completion.chunk"));
    }
}
