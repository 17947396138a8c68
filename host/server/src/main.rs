//! The `hangar` binary: a thin shell over [`hangar::cli`].

fn main() -> std::process::ExitCode {
    hangar::cli::main()
}
