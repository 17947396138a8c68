//! Platforms: the operating system, architecture and accelerators of a
//! machine, and the platform entries a manifest declares.
//!
//! Names follow Rust's `std::env::consts` (`linux`, `macos`, `x86_64`,
//! `aarch64`) so that the host can fill them in without a lookup table.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An accelerator an engine can run on.
///
/// Unknown names are kept as [`Accelerator::Other`] so that a manifest
/// written for a future accelerator still parses; it simply matches no
/// machine that does not report the same name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Accelerator {
    /// Apple GPUs through Metal (Apple Silicon Macs).
    Metal,
    /// NVIDIA GPUs with a CUDA 12 driver.
    Cuda12,
    /// NVIDIA GPUs with a CUDA 13 driver.
    Cuda13,
    /// Plain CPU execution; every machine has it.
    Cpu,
    /// Any other accelerator, by its lowercase name (`rocm`, `vulkan`, …).
    Other(String),
}

impl Accelerator {
    /// The name used in manifests, config files and the CLI.
    pub fn as_str(&self) -> &str {
        match self {
            Accelerator::Metal => "metal",
            Accelerator::Cuda12 => "cuda12",
            Accelerator::Cuda13 => "cuda13",
            Accelerator::Cpu => "cpu",
            Accelerator::Other(name) => name,
        }
    }

    /// How much faster than the CPU this accelerator usually is; a higher
    /// rank is preferred when a plugin supports several of a machine's.
    pub fn rank(&self) -> u8 {
        match self {
            Accelerator::Metal | Accelerator::Cuda13 => 3,
            Accelerator::Cuda12 => 2,
            Accelerator::Other(_) => 1,
            Accelerator::Cpu => 0,
        }
    }
}

impl FromStr for Accelerator {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "metal" => Accelerator::Metal,
            "cuda12" => Accelerator::Cuda12,
            "cuda13" => Accelerator::Cuda13,
            "cpu" => Accelerator::Cpu,
            other => Accelerator::Other(other.to_string()),
        })
    }
}

impl fmt::Display for Accelerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Accelerator {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Accelerator {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(s.parse().unwrap_or_else(|never| match never {}))
    }
}

/// A machine as plugins see it: one operating system, one architecture, and
/// every accelerator it has (always including [`Accelerator::Cpu`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `linux`, `macos`, `windows`, …
    pub os: String,
    /// `x86_64`, `aarch64`, …
    pub arch: String,
    /// Accelerators present, best first.
    pub accelerators: Vec<Accelerator>,
}

impl Platform {
    /// Parses the compact form `os/arch/acc1,acc2` used by the
    /// `HANGAR_PLATFORM` override (`linux/x86_64/cuda13,cpu`). `cpu` is added
    /// when missing, since every machine can run on its CPU.
    pub fn parse_compact(text: &str) -> Result<Platform, String> {
        let parts: Vec<&str> = text.trim().split('/').collect();
        let [os, arch, accelerators] = parts.as_slice() else {
            return Err(format!(
                "platform '{text}' is not of the form os/arch/accelerators (e.g. linux/x86_64/cuda13,cpu)"
            ));
        };
        if os.is_empty() || arch.is_empty() {
            return Err(format!("platform '{text}' has an empty os or arch"));
        }
        let mut accs: Vec<Accelerator> = accelerators
            .split(',')
            .filter(|a| !a.trim().is_empty())
            .map(|a| a.parse().unwrap_or_else(|never| match never {}))
            .collect();
        if !accs.contains(&Accelerator::Cpu) {
            accs.push(Accelerator::Cpu);
        }
        Ok(Platform::new(os, arch, accs))
    }

    /// A platform with its accelerators sorted best first and deduplicated.
    pub fn new(os: &str, arch: &str, mut accelerators: Vec<Accelerator>) -> Platform {
        accelerators.sort_by(|a, b| b.rank().cmp(&a.rank()).then_with(|| a.cmp(b)));
        accelerators.dedup();
        Platform {
            os: os.to_string(),
            arch: arch.to_string(),
            accelerators,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let accs: Vec<&str> = self.accelerators.iter().map(Accelerator::as_str).collect();
        write!(f, "{}/{}/{}", self.os, self.arch, accs.join(","))
    }
}

/// One platform entry of a manifest: an engine build for one os and arch,
/// able to use any of the listed accelerators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformSpec {
    /// Operating system, as in [`Platform::os`].
    pub os: String,
    /// Architecture, as in [`Platform::arch`].
    pub arch: String,
    /// Accelerators this build can use.
    pub accelerators: Vec<Accelerator>,
    /// The plugin's formats this build serves; empty (the default) is every
    /// one of them. Added in 1.x: an engine that reads a format only on
    /// some platforms (mlx-lm reads `gguf` only on macOS arm64) says so
    /// here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<String>,
}

impl PlatformSpec {
    /// The best accelerator of `machine` that this entry can use, or `None`
    /// when the entry does not fit the machine at all.
    pub fn best_match(&self, machine: &Platform) -> Option<Accelerator> {
        if self.os != machine.os || self.arch != machine.arch {
            return None;
        }
        machine
            .accelerators
            .iter()
            .find(|a| self.accelerators.contains(a))
            .cloned()
    }

    /// Whether this entry serves `format` (one of the plugin's formats).
    pub fn serves(&self, format: &str) -> bool {
        self.formats.is_empty() || self.formats.iter().any(|f| f == format)
    }
}

impl fmt::Display for PlatformSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let accs: Vec<&str> = self.accelerators.iter().map(Accelerator::as_str).collect();
        write!(f, "{}/{}/{}", self.os, self.arch, accs.join(","))?;
        if !self.formats.is_empty() {
            write!(f, " ({})", self.formats.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_form_round_trips_and_always_has_cpu() {
        let p = Platform::parse_compact("linux/x86_64/cuda13").unwrap();
        assert_eq!(p.to_string(), "linux/x86_64/cuda13,cpu");
        assert!(Platform::parse_compact("linux").is_err());
    }

    #[test]
    fn best_match_prefers_the_fastest_shared_accelerator() {
        let machine = Platform::parse_compact("linux/x86_64/cuda13,cpu").unwrap();
        let spec = PlatformSpec {
            os: "linux".into(),
            arch: "x86_64".into(),
            accelerators: vec![Accelerator::Cpu, Accelerator::Cuda13],
            formats: vec![],
        };
        assert_eq!(spec.best_match(&machine), Some(Accelerator::Cuda13));
        let mac = Platform::parse_compact("macos/aarch64/metal").unwrap();
        assert_eq!(spec.best_match(&mac), None);
    }
}
