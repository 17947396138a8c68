//! What an engine's process tree holds in memory: the resident set of the
//! keeper and every process below it, read from Linux's `/proc`, and what
//! processes hold on NVIDIA GPUs (`nvidia-smi`).

use std::collections::HashMap;

/// Resident bytes of `root` and all its descendants; `None` where `/proc`
/// cannot be read (macOS) or `root` is gone.
pub(crate) fn tree_rss(root: u32) -> Option<u64> {
    tree_rss_parts(root).map(|(own, below)| own + below)
}

/// Resident bytes of `root` itself and of all its descendants together.
pub(crate) fn tree_rss_parts(root: u32) -> Option<(u64, u64)> {
    let below = descendants(root)?;
    let own = rss(root)?;
    Some((own, below.iter().filter_map(|&pid| rss(pid)).sum()))
}

/// Every process below `root` (children, their children, ...); `None`
/// where `/proc` cannot be read.
pub(crate) fn descendants(root: u32) -> Option<Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for pid in pids()? {
        if let Some(ppid) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(parent)
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut below = Vec::new();
    let mut stack = children.remove(&root).unwrap_or_default();
    while let Some(pid) = stack.pop() {
        below.push(pid);
        stack.extend(children.remove(&pid).unwrap_or_default());
    }
    Some(below)
}

/// The memory each process holds on NVIDIA GPUs, summed over GPUs, by pid:
/// `nvidia-smi`'s compute apps. `None` where `nvidia-smi` is missing or
/// fails. Inside a container whose pids the driver does not see, no pid
/// matches.
pub(crate) fn gpu_memory_by_pid() -> Option<HashMap<u32, u64>> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| parse_compute_apps(&String::from_utf8_lossy(&out.stdout)))
}

/// `nvidia-smi --query-compute-apps=pid,used_memory` lines (`pid, MiB`) as
/// bytes by pid; lines it cannot read (`[N/A]`) are left out.
fn parse_compute_apps(text: &str) -> HashMap<u32, u64> {
    let mut by_pid = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(',').map(str::trim);
        let pid = fields.next().and_then(|f| f.parse::<u32>().ok());
        let mib = fields.next().and_then(|f| f.parse::<u64>().ok());
        if let (Some(pid), Some(mib)) = (pid, mib) {
            *by_pid.entry(pid).or_default() += mib << 20;
        }
    }
    by_pid
}

/// Every process's pid, from `/proc`; `None` where there is no `/proc`
/// (macOS).
pub(crate) fn pids() -> Option<impl Iterator<Item = u32>> {
    Some(
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok()),
    )
}

/// The parent pid from a `/proc/PID/stat` line (the command name, in
/// parentheses, may hold spaces and parentheses itself).
fn parent(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Resident bytes of one process.
pub(crate) fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_memory_is_read_per_process_and_summed_over_gpus() {
        let text = "1234, 5000\n77, 12\n1234, 1000\n88, [N/A]\n";
        let by_pid = super::parse_compute_apps(text);
        assert_eq!(by_pid.get(&1234), Some(&(6000 << 20)));
        assert_eq!(by_pid.get(&77), Some(&(12 << 20)));
        assert_eq!(by_pid.get(&88), None);
        assert!(super::parse_compute_apps("").is_empty());
    }

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(super::parent("42 (a b) c)) S 7 42 42 0"), Some(7));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_holds_some_memory() {
        let own = super::tree_rss(std::process::id()).expect("/proc is readable here");
        assert!(own > 1 << 20, "{own}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_counts_below_its_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        // The child's own figure changes as it execs, so the two readings
        // are not compared with each other: each must see memory.
        let (own, below) = super::tree_rss_parts(std::process::id()).unwrap();
        let (sleep, _) = super::tree_rss_parts(child.id()).unwrap();
        assert!(
            own > 1024 * 1024 && below > 0 && sleep > 0,
            "{own} {below} {sleep}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
