//! Facts about the machine a benchmark ran on (CPU model, memory, load
//! average, the time), read from `/proc` on Linux; elsewhere they are
//! reported as unknown rather than guessed.

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

/// Now, as RFC 3339 UTC with seconds (`2026-12-01T05:01:18Z`).
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_says_its_memory_load_and_time() {
        assert!(load_average().is_some() && memory_bytes().is_some());
        assert_eq!(now_rfc3339().len(), "2026-12-01T05:01:18Z".len());
    }
}
