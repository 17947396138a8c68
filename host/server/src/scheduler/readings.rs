//! What the machine has: memory total and available (Linux `/proc/meminfo`
//! within the cgroup's limit, v2 or v1; macOS `sysctl` and `vm_stat`, best
//! effort) and the GPU's free memory (`nvidia-smi`, best effort). The
//! parsing is pure and tested; reading is the only I/O.

use std::process::Command;

use super::guard::Reading;

/// Reads the machine's memory now; `None` where nothing could be read.
/// `gpu`: also ask `nvidia-smi` (a subprocess: only when an engine runs on
/// a CUDA device).
pub fn machine(gpu: bool) -> Option<Reading> {
    let mut reading = if cfg!(target_os = "macos") {
        macos()
    } else {
        linux()
    }?;
    if gpu {
        reading.device_free = nvidia_free();
    }
    Some(reading)
}

fn linux() -> Option<Reading> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let read = |p: &str| std::fs::read_to_string(p).ok();
    // v2: the host's own cgroup (`0::/PATH` in /proc/self/cgroup), whose
    // files a container sees at the mount's root.
    let own = read("/proc/self/cgroup")
        .as_deref()
        .and_then(cgroup_v2_path)
        .unwrap_or_default();
    let v2 = |file: &str| {
        read(&format!("/sys/fs/cgroup{own}/{file}"))
            .or_else(|| read(&format!("/sys/fs/cgroup/{file}")))
    };
    let cgroup = v2("memory.max").zip(v2("memory.current")).or_else(|| {
        // v1: the memory controller's hierarchy (`N:memory:/PATH`).
        let own = read("/proc/self/cgroup")
            .as_deref()
            .and_then(cgroup_v1_memory_path)
            .unwrap_or_default();
        let v1 = |file: &str| {
            read(&format!("/sys/fs/cgroup/memory{own}/{file}"))
                .or_else(|| read(&format!("/sys/fs/cgroup/memory/{file}")))
        };
        v1("memory.limit_in_bytes").zip(v1("memory.usage_in_bytes"))
    });
    parse_linux(
        &meminfo,
        cgroup.as_ref().map(|(l, c)| (l.as_str(), c.as_str())),
    )
}

/// The cgroup v2 path from `/proc/self/cgroup` (`0::/user.slice/…`).
pub fn cgroup_v2_path(text: &str) -> Option<String> {
    plain(text.lines().find_map(|l| l.strip_prefix("0::"))?.trim())
}

/// The cgroup v1 memory controller's path from `/proc/self/cgroup`
/// (`4:memory:/docker/…`).
pub fn cgroup_v1_memory_path(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    plain(path.trim())
}

/// `path` when it is a plain absolute path below the root: nothing may
/// climb out of /sys/fs/cgroup.
fn plain(path: &str) -> Option<String> {
    let plain = path.starts_with('/') && !path.split('/').any(|c| c == "..");
    (plain && path != "/").then(|| path.to_string())
}

/// The reading from `/proc/meminfo`'s text and the cgroup's (limit,
/// usage) files: the lower of the machine's and the cgroup's figures.
pub fn parse_linux(meminfo: &str, cgroup: Option<(&str, &str)>) -> Option<Reading> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(':'))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let mut total = field("MemTotal")?;
    let mut available = field("MemAvailable").or_else(|| field("MemFree"))?;
    if let Some((limit, usage)) = cgroup {
        // "max" (v2) or a page-rounded i64::MAX (v1) mean no limit.
        let limit = limit.trim().parse::<u64>().ok().filter(|l| *l < total);
        let usage = usage.trim().parse::<u64>().ok();
        if let (Some(limit), Some(usage)) = (limit, usage) {
            total = limit;
            available = available.min(limit.saturating_sub(usage));
        }
    }
    Some(Reading {
        total,
        available,
        device_free: None,
    })
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn macos() -> Option<Reading> {
    let total: u64 = output("sysctl", &["-n", "hw.memsize"])?
        .trim()
        .parse()
        .ok()?;
    // Free, inactive and purgeable pages are what the system hands out
    // before it compresses or swaps.
    let vm = output("vm_stat", &[]).unwrap_or_default();
    let page: u64 = vm
        .split("page size of ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(16384);
    let pages = |name: &str| {
        vm.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().trim_end_matches('.').parse::<u64>().ok())
            .unwrap_or(0)
    };
    let free = (pages("Pages free") + pages("Pages inactive") + pages("Pages purgeable")) * page;
    Some(Reading {
        total,
        available: if free == 0 { total } else { free.min(total) },
        device_free: None,
    })
}

/// Free memory over every GPU `nvidia-smi` lists, in bytes.
fn nvidia_free() -> Option<u64> {
    let text = output(
        "nvidia-smi",
        &["--query-gpu=memory.free", "--format=csv,noheader,nounits"],
    )?;
    parse_nvidia(&text)
}

/// `nvidia-smi`'s free MiB, one line per GPU, summed as bytes.
pub fn parse_nvidia(text: &str) -> Option<u64> {
    let mibs: Vec<u64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .collect();
    (!mibs.is_empty()).then(|| mibs.iter().sum::<u64>() * (1 << 20))
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    fn check(meminfo: &str, cgroup: Option<(&str, &str)>, expect: Expect) {
        expect.assert_eq(&format!("{:?}", super::parse_linux(meminfo, cgroup)));
    }

    const MEMINFO: &str =
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n";

    #[test]
    fn linux_readings_take_the_lower_of_machine_and_cgroup() {
        check(
            MEMINFO,
            None,
            expect![[
                r#"Some(Reading { total: 16384000000, available: 8192000000, device_free: None })"#
            ]],
        );
        check(
            MEMINFO,
            Some(("max\n", "123\n")),
            expect![[
                r#"Some(Reading { total: 16384000000, available: 8192000000, device_free: None })"#
            ]],
        );
        check(
            MEMINFO,
            Some(("4294967296\n", "1073741824\n")),
            expect![[
                r#"Some(Reading { total: 4294967296, available: 3221225472, device_free: None })"#
            ]],
        );
        check(
            MEMINFO,
            Some(("9223372036854771712\n", "1073741824\n")),
            expect![[
                r#"Some(Reading { total: 16384000000, available: 8192000000, device_free: None })"#
            ]],
        );
        check("garbage", None, expect![[r#"None"#]]);
    }

    #[test]
    fn the_hosts_own_cgroup_is_found() {
        assert_eq!(
            super::cgroup_v2_path("12:cpu:/x\n0::/user.slice/app.scope\n"),
            Some("/user.slice/app.scope".into())
        );
        assert_eq!(super::cgroup_v2_path("0::/\n"), None);
        assert_eq!(super::cgroup_v2_path("0::/../etc\n"), None);
        assert_eq!(super::cgroup_v2_path("4:memory:/docker/abc\n"), None);
        assert_eq!(
            super::cgroup_v1_memory_path("5:devices:/\n4:memory:/docker/abc\n0::/\n"),
            Some("/docker/abc".into())
        );
    }

    #[test]
    fn nvidia_smi_free_memory_is_summed_over_gpus() {
        assert_eq!(super::parse_nvidia("1024\n2048\n"), Some(3 << 30));
        assert_eq!(super::parse_nvidia("No devices were found\n"), None);
    }
}
