//! A bounded per-session log of an engine's standard output and error.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Keeps the last `capacity` lines; older lines are dropped and counted.
#[derive(Debug)]
pub(crate) struct EngineLog {
    inner: Mutex<Inner>,
    capacity: usize,
    /// Each line as it is pushed, for `GET /api/sessions/{id}/logs/stream`.
    feed: tokio::sync::broadcast::Sender<String>,
}

#[derive(Debug, Default)]
struct Inner {
    lines: VecDeque<String>,
    dropped: u64,
}

/// Lines longer than this are cut, so one runaway line cannot hold memory.
const MAX_LINE: usize = 4096;

impl EngineLog {
    /// A log holding at most `capacity` lines.
    pub(crate) fn new(capacity: usize) -> EngineLog {
        EngineLog {
            inner: Mutex::new(Inner::default()),
            capacity,
            feed: tokio::sync::broadcast::channel(capacity.max(1)).0,
        }
    }

    /// Appends one line (`stream` is `stdout` or `stderr`).
    pub(crate) fn push(&self, stream: &str, line: &str) {
        let mut line = format!("[{stream}] {}", line.trim_end());
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        let mut inner = self.inner.lock().expect("log lock");
        if inner.lines.len() == self.capacity {
            inner.lines.pop_front();
            inner.dropped += 1;
        }
        // Sent under the lock: see `subscribe`. No subscriber is no error.
        let _ = self.feed.send(line.clone());
        inner.lines.push_back(line);
    }

    /// Every kept line and every later one as it is pushed (taken under
    /// the lock pushes send under, so nothing is missed or repeated).
    pub(crate) fn subscribe(&self) -> (Vec<String>, tokio::sync::broadcast::Receiver<String>) {
        let inner = self.inner.lock().expect("log lock");
        (inner.lines.iter().cloned().collect(), self.feed.subscribe())
    }

    /// Every kept line, oldest first, and how many were dropped before them.
    pub(crate) fn snapshot(&self) -> (Vec<String>, u64) {
        let inner = self.inner.lock().expect("log lock");
        (inner.lines.iter().cloned().collect(), inner.dropped)
    }

    /// The last `n` lines, for error messages.
    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let inner = self.inner.lock().expect("log lock");
        let skip = inner.lines.len().saturating_sub(n);
        inner.lines.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_lines_and_counts_the_rest() {
        let log = EngineLog::new(2);
        for i in 0..5 {
            log.push("stdout", &format!("line {i}\n"));
        }
        let (lines, dropped) = log.snapshot();
        assert_eq!(lines, ["[stdout] line 3", "[stdout] line 4"]);
        assert_eq!(dropped, 3);
        assert_eq!(log.tail(1), ["[stdout] line 4"]);
    }
}
