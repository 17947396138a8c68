//! Detects this machine's platform: os, arch and accelerators.
//!
//! Metal is reported on Apple Silicon Macs. CUDA is reported where an NVIDIA
//! driver is present, as `cuda13` or `cuda12` from the CUDA version the
//! driver supports (read from `nvidia-smi`, else from the driver version).
//! The CPU is always there. `HANGAR_PLATFORM=os/arch/acc,acc` or the
//! config's `platform` key overrides detection (tests, cross-checks).

use std::process::Command;

use hangar_plugin_api::{Accelerator, Platform};

/// The environment variable that overrides detection.
pub const PLATFORM_ENV: &str = "HANGAR_PLATFORM";

/// This machine's platform, honouring an override.
pub fn current(override_: Option<&str>) -> Result<Platform, String> {
    if let Some(text) = std::env::var(PLATFORM_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .or(override_.map(str::to_string))
    {
        return Platform::parse_compact(&text)
            .map_err(|e| format!("{e} (from {PLATFORM_ENV} or the config's 'platform')"));
    }
    Ok(detect())
}

/// Detects the platform from the running machine.
pub fn detect() -> Platform {
    let os = std::env::consts::OS;
    let arch = std::env::consts::ARCH;
    let mut accelerators = vec![Accelerator::Cpu];
    if os == "macos" && arch == "aarch64" {
        accelerators.push(Accelerator::Metal);
    }
    if let Some(cuda) = detect_cuda() {
        accelerators.push(cuda);
    }
    Platform::new(os, arch, accelerators)
}

fn detect_cuda() -> Option<Accelerator> {
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
    let smi = Command::new("nvidia-smi")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if driver.is_none() && smi.is_none() {
        return None;
    }
    let major = smi
        .as_deref()
        .and_then(cuda_major_from_smi)
        .or_else(|| driver.as_deref().and_then(cuda_major_from_driver))?;
    match major {
        13.. => Some(Accelerator::Cuda13),
        12 => Some(Accelerator::Cuda12),
        _ => None,
    }
}

/// `| NVIDIA-SMI 580.65   Driver Version: 580.65   CUDA Version: 13.0 |` → 13.
fn cuda_major_from_smi(text: &str) -> Option<u32> {
    let after = text.split("CUDA Version:").nth(1)?;
    after.trim().split('.').next()?.trim().parse().ok()
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 …` → 13:
/// drivers from 580 support CUDA 13, from 525 CUDA 12.
fn cuda_major_from_driver(text: &str) -> Option<u32> {
    let version = text
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))?;
    let major: u32 = version.split('.').next()?.parse().ok()?;
    match major {
        580.. => Some(13),
        525.. => Some(12),
        _ => Some(11),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_are_read_from_smi_and_driver() {
        let smi = "| NVIDIA-SMI 580.65.06  Driver Version: 580.65.06  CUDA Version: 13.0 |";
        assert_eq!(cuda_major_from_smi(smi), Some(13));
        let driver = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19";
        assert_eq!(cuda_major_from_driver(driver), Some(12));
    }
}
