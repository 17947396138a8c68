//! The memory guard's arithmetic: how much the host's models may hold,
//! given the guard's level, an operator's byte limit and the latest memory
//! reading. Pure: readings arrive from [`super::readings`].

use std::fmt;

/// How much memory the guard keeps free for the system and other programs.
///
/// The levels and reserves are oMLX's. With a reading of the machine
/// (`total` bytes, `available` bytes that others do not use), models may
/// hold at most
///
/// ```text
/// min(total − static reserve, held by models + available − others reserve)
/// ```
///
/// | level | static reserve | others reserve |
/// |---|---|---|
/// | `safe` | 12 GiB | 2 GiB |
/// | `balanced` | 8 GiB | 1 GiB |
/// | `aggressive` | 6 GiB | 512 MiB |
///
/// The static reserve keeps room for the operating system and the host on
/// a machine that has nothing else running; the others reserve keeps room
/// for what else runs now. `off` (the default) applies no ceiling of its
/// own; `--memory-limit BYTES` is a ceiling of its own, and when both are
/// given the lower one holds. "Total" is the machine's memory or its cgroup
/// limit, whichever is lower; "available" is Linux's `MemAvailable` (or
/// what the cgroup has left).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Guard {
    /// No ceiling from the guard.
    #[default]
    Off,
    /// 12 GiB static, 2 GiB for other programs.
    Safe,
    /// 8 GiB static, 1 GiB for other programs.
    Balanced,
    /// 6 GiB static, 512 MiB for other programs.
    Aggressive,
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

impl Guard {
    /// `(static reserve, others reserve)` in bytes; `None` for `off`.
    pub fn reserves(self) -> Option<(u64, u64)> {
        match self {
            Guard::Off => None,
            Guard::Safe => Some((12 * GIB, 2 * GIB)),
            Guard::Balanced => Some((8 * GIB, GIB)),
            Guard::Aggressive => Some((6 * GIB, 512 * MIB)),
        }
    }
}

impl std::str::FromStr for Guard {
    type Err = String;

    fn from_str(s: &str) -> Result<Guard, String> {
        match s {
            "off" => Ok(Guard::Off),
            "safe" => Ok(Guard::Safe),
            "balanced" => Ok(Guard::Balanced),
            "aggressive" => Ok(Guard::Aggressive),
            other => Err(format!(
                "'{other}' is not a memory guard level; use off, safe, balanced or aggressive"
            )),
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Guard::Off => "off",
            Guard::Safe => "safe",
            Guard::Balanced => "balanced",
            Guard::Aggressive => "aggressive",
        })
    }
}

/// What the machine has, as last read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// All memory the host may use: the machine's, or its cgroup limit.
    pub total: u64,
    /// Memory nobody uses now (`MemAvailable`, or what the cgroup has left).
    pub available: u64,
    /// Free memory of the GPU, when one is there and could be read.
    pub device_free: Option<u64>,
}

/// The most the host's models may hold: the lower of `limit` and the
/// guard's ceiling over `reading` (`held`: what the models hold now, which
/// `available` does not count). `None`: no ceiling.
pub fn ceiling(
    guard: Guard,
    limit: Option<u64>,
    reading: Option<Reading>,
    held: u64,
) -> Option<u64> {
    let guarded = match (guard.reserves(), reading) {
        (Some((fixed, others)), Some(r)) => Some(
            r.total
                .saturating_sub(fixed)
                .min((held + r.available).saturating_sub(others)),
        ),
        _ => None,
    };
    match (limit, guarded) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Bytes in the largest unit that keeps them readable (`1.5 GiB`).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
