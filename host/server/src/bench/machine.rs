//! Facts about the machine a benchmark ran on (CPU model, memory, load
//! average, the time) and the resident memory of a process tree, read from
//! `/proc` on Linux; elsewhere they are reported as unknown rather than
//! guessed.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// The CPU's model name (`/proc/cpuinfo`'s first `model name`).
pub(crate) fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The machine's memory in bytes (`MemTotal`).
pub(crate) fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemTotal:").map(|k| k * 1024)
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The resident memory of process `root`, and of every process below it
/// (its children, theirs, …), in bytes; `None` where `/proc` cannot say
/// (not Linux, or `root` is gone).
pub(crate) fn tree_rss_bytes(root: u32) -> Option<(u64, u64)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(parent_pid)
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let own = rss_bytes(root)?;
    let mut below = 0;
    let mut todo = children.remove(&root).unwrap_or_default();
    while let Some(pid) = todo.pop() {
        below += rss_bytes(pid).unwrap_or(0);
        todo.extend(children.remove(&pid).unwrap_or_default());
    }
    Some((own, below))
}

/// The parent pid in a `/proc/PID/stat` line: the fourth field, counted
/// after the command name's closing parenthesis (a name may hold spaces).
fn parent_pid(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kib_field(&text, "VmRSS:").map(|k| k * 1024)
}

/// Now, as RFC 3339 UTC with seconds (`2026-12-01T05:01:18Z`).
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the epoch as RFC 3339 UTC (civil-from-days, H. Hinnant).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_stat_lines() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_101_278), "2026-12-01T05:01:18Z");
        assert_eq!(parent_pid("12 (a b) c) S 7 12 12 0"), Some(7));
        assert_eq!(parent_pid("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_tree_with_memory() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let (own, below) = tree_rss_bytes(std::process::id()).unwrap();
        let (sleep, _) = tree_rss_bytes(child.id()).unwrap();
        assert!(
            own > 1024 * 1024 && below >= sleep && sleep > 0,
            "{own} {below} {sleep}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(load_average().is_some() && memory_bytes().is_some());
    }
}
