//! What MLX this engine runs on: its version and the default device.

use std::fmt;

use mlx_rs::{Device, DeviceType};

use crate::error::Result;
use crate::ffi::mlx_version;

/// A device kind as MLX reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU backend.
    Cpu,
    /// A GPU backend (Metal on macOS, CUDA on Linux).
    Gpu,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        })
    }
}

/// The result of [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxProbe {
    /// The version of the `libmlx` loaded at run time (`0.32.4`).
    pub version: String,
    /// The device new arrays are computed on.
    pub device: DeviceKind,
}

/// Asks the loaded MLX library for its version and default device.
pub fn probe() -> Result<MlxProbe> {
    let device = match Device::try_default()?.get_type()? {
        DeviceType::Cpu => DeviceKind::Cpu,
        DeviceType::Gpu => DeviceKind::Gpu,
    };
    Ok(MlxProbe {
        version: mlx_version()?,
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_pinned_version_and_a_device() {
        let probe = probe().unwrap();
        assert_eq!(probe.version, "0.32.4");
        // The CPU wheel in CI; a GPU where MLX finds one.
        assert!(matches!(probe.device, DeviceKind::Cpu | DeviceKind::Gpu));
    }
}
