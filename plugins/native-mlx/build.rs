//! Gives the crate's binaries and tests an rpath to the libmlx.so they link.

fn main() {
    // mlx-sys (patched for Linux) publishes the directory of libmlx.so; a
    // link argument emitted by mlx-sys itself would not reach our binaries.
    // On macOS MLX is linked statically and there is nothing to publish.
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
