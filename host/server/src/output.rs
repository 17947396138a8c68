//! A command's output on stdout. A reader that goes away early
//! (`hangar resolve mlx | head -1`) makes the write fail with a broken
//! pipe, which ends the command quietly; `println!` would panic instead.

use std::io::{self, Write};

/// Writes one line to stdout, with `outln!`'s arguments.
pub(crate) fn line(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Whether `error` is, or was caused by, stdout's reader going away.
pub(crate) fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns the write's `io::Result` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
