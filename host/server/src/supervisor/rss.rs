//! What an engine's process tree holds in memory: the resident set of the
//! keeper and every process below it, read from Linux's `/proc`.

use std::collections::HashMap;

/// Resident bytes of `root` and all its descendants; `None` where `/proc`
/// cannot be read (macOS) or `root` is gone.
pub(crate) fn tree_rss(root: u32) -> Option<u64> {
    tree_rss_parts(root).map(|(own, below)| own + below)
}

/// Resident bytes of `root` itself and of all its descendants together.
pub(crate) fn tree_rss_parts(root: u32) -> Option<(u64, u64)> {
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
    let own = rss(root)?;
    let mut below = 0;
    let mut stack = children.remove(&root).unwrap_or_default();
    while let Some(pid) = stack.pop() {
        below += rss(pid).unwrap_or(0);
        stack.extend(children.remove(&pid).unwrap_or_default());
    }
    Some((own, below))
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

fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
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
