//! The ranks of a distributed engine: finding each local rank's process
//! among the launcher's, and telling whether it still runs.
//!
//! An engine's launcher (`mlx.launch`) starts every rank; those on this
//! machine are its children, in the keeper's process group. The plan marks
//! each rank with an environment entry (`MLX_RANK=1`), which is how the
//! host tells them apart. Linux's `/proc` is read; elsewhere the pids stay
//! unknown and the launcher alone stops the group when a rank dies.

use std::collections::HashMap;

/// The pid of the process in group `pgid` whose environment holds
/// `marker`; where a rank's own children inherit the marker, the one whose
/// parent lacks it. `None` when no such process runs (or `/proc` is
/// missing).
pub(crate) fn find(pgid: i32, marker: &str) -> Option<u32> {
    let mut marked: HashMap<u32, u32> = HashMap::new();
    for pid in super::rss::pids()? {
        let Some(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok() else {
            continue;
        };
        let Some((state, ppid, group)) = fields(&stat) else {
            continue;
        };
        if group != pgid || state == 'Z' {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ.split(|&b| b == 0).any(|e| e == marker.as_bytes()) {
            marked.insert(pid, ppid);
        }
    }
    marked
        .iter()
        .filter(|(_, ppid)| !marked.contains_key(ppid))
        .map(|(&pid, _)| pid)
        .min()
}

/// Whether `pid` still runs (a zombie, dead but not yet reaped by the
/// launcher, does not).
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => fields(&stat).is_some_and(|(state, ..)| state != 'Z'),
        Err(_) => false,
    }
}

/// State, parent pid and process group from a `/proc/PID/stat` line (the
/// command name, in parentheses, may hold spaces and parentheses itself).
fn fields(stat: &str) -> Option<(char, u32, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    let pgrp = it.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

#[cfg(test)]
mod tests {
    #[test]
    fn stat_fields_are_read_past_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(
            super::fields("42 (a b) c)) S 7 40 40 0"),
            Some(('S', 7, 40))
        );
        assert_eq!(super::fields("42 (x) Z 7 40"), Some(('Z', 7, 40)));
        assert_eq!(super::fields("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_marked_child_is_found_in_its_group_and_seen_to_die() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("HANGAR_TEST_RANK", "7")
            .process_group(0)
            .spawn()
            .expect("sleep runs");
        let pid = child.id();
        let found = (0..100).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            super::find(pid as i32, "HANGAR_TEST_RANK=7")
        });
        assert_eq!(found, Some(pid));
        assert_eq!(super::find(pid as i32, "HANGAR_TEST_RANK=8"), None);
        assert!(super::alive(pid));
        child.kill().expect("kill");
        // Dead but unreaped: a zombie counts as gone.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!super::alive(pid));
        child.wait().expect("reaped");
        assert!(!super::alive(pid));
    }
}
