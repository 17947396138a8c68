//! The `hangar` binary: a thin shell over [`hangar::cli`].

/// With feature `mimalloc`, mimalloc is the whole process's malloc (MLX and
/// in-process plugins included), as in native-mlx-bench.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    hangar::cli::main()
}
