//! Hangar's CUDA matrix-vector kernel for quantized weights (`src/qmv.rs`)
//! against MLX's `quantized_matmul`, on random weights: on a GPU it must
//! agree to the output dtype's rounding; elsewhere it must be refused with
//! an error (the engine never asks for it there).

use hangar_native_mlx::{
    check_gather_qmv, check_paged_attention, check_qmv, probe, DeviceKind, GatherShape, QmvShape,
};
use mlx_rs::Dtype;

#[test]
fn the_quantized_matrix_vector_kernel_matches_mlx_on_a_gpu_and_is_refused_elsewhere() {
    let gpu = probe().expect("MLX answers").device == DeviceKind::Gpu;
    // (in, out, rows of x, bits, group size): 0.5B's shapes, several rows,
    // 8 bits, the other group sizes, an output count no block divides.
    let shapes = [
        (896, 1152, 1, 4, 64),
        (4864, 896, 4, 4, 64),
        (896, 643, 8, 8, 32),
        (1024, 384, 3, 4, 128),
    ];
    for (k, n, rows, bits, group_size) in shapes {
        for (dtype, tolerance) in [
            (Dtype::Bfloat16, 1e-2),
            (Dtype::Float16, 2e-3),
            (Dtype::Float32, 1e-4),
        ] {
            let shape = QmvShape {
                k,
                n,
                rows,
                bits,
                group_size,
            };
            let checked = check_qmv(shape, dtype, 1, 1);
            let what =
                format!("{n}x{k}, {rows} rows, {bits} bits, groups of {group_size}, {dtype:?}");
            if gpu {
                let c = checked.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    c.max_error <= tolerance,
                    "{what}: differs from quantized_matmul by {} of its largest value",
                    c.max_error
                );
            } else {
                assert!(checked.is_err(), "{what}: ran without a GPU");
            }
        }
    }
}

#[test]
fn the_sorted_gathered_kernel_matches_mlx_on_a_gpu_and_is_refused_elsewhere() {
    let gpu = probe().expect("MLX answers").device == DeviceKind::Gpu;
    // (experts, in, out, rows, bits, group size): one row, a few experts
    // with more rows than a pass takes (4), most experts empty, 8 bits,
    // an output count no block divides, the other group sizes.
    let shapes = [
        (8, 256, 128, 1, 4, 64),
        (4, 512, 96, 37, 4, 64),
        (64, 256, 64, 16, 4, 32),
        (16, 384, 203, 64, 8, 128),
    ];
    for (experts, k, n, rows, bits, group_size) in shapes {
        for (dtype, tolerance) in [(Dtype::Bfloat16, 1e-2), (Dtype::Float32, 1e-4)] {
            let shape = GatherShape {
                experts,
                k,
                n,
                rows,
                bits,
                group_size,
            };
            let checked = check_gather_qmv(shape, dtype, 1, 1);
            let what = format!(
                "{experts} experts of {n}x{k}, {rows} rows, {bits} bits, groups of {group_size}, {dtype:?}"
            );
            if gpu {
                let c = checked.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    c.max_error <= tolerance,
                    "{what}: differs from gather_qmm by {} of its largest value",
                    c.max_error
                );
            } else {
                assert!(checked.is_err(), "{what}: ran without a GPU");
            }
        }
    }
}

#[test]
fn the_paged_attention_kernel_matches_mlx_on_a_gpu_and_is_refused_elsewhere() {
    let gpu = probe().expect("MLX answers").device == DeviceKind::Gpu;
    // Rows of one position, a page and one past it, several pages.
    let lens = [1, 5, 128, 129, 300];
    // (heads, kv heads, head dim): 0.5B's, 7B's, Qwen3's, no grouping.
    for (heads, kv_heads, d) in [(14, 2, 64), (28, 4, 128), (32, 8, 128), (4, 4, 64)] {
        for (dtype, tolerance) in [
            (Dtype::Bfloat16, 1e-2),
            (Dtype::Float16, 2e-3),
            // MLX's CUDA float32 products (the reference) run on TF32
            // tensor cores: 8e-5 to 1.2e-4 on an H200.
            (Dtype::Float32, 1e-3),
        ] {
            let checked = check_paged_attention(heads, kv_heads, d, &lens, dtype);
            let what = format!("{heads} heads over {kv_heads}, head dim {d}, {dtype:?}");
            if gpu {
                let error = checked.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    error <= tolerance,
                    "{what}: differs by {error} of the largest value"
                );
            } else {
                assert!(checked.is_err(), "{what}: ran without a GPU");
            }
        }
    }
}
