//! A CUDA matrix-vector product for MLX's affine 4- and 8-bit weights, for
//! the few rows of a decoding step (issue 34): MLX 0.32's own CUDA `qmv`
//! moves the weights at about 0.8 TB/s of an H200's 4.8.
//!
//! The kernel reads MLX's own layout (`uint32` words packing 8 four-bit or
//! 4 eight-bit values, lowest bits first; one scale and one bias per group
//! of 32, 64 or 128 values along a row) and computes `x @ W.T` for up to
//! [`MAX_ROWS`] rows of `x`. One warp owns a few consecutive output rows:
//! each lane loads 16 bytes of each row's weights at a time (32 four-bit
//! values), so a warp reads 512 contiguous bytes of a row per step, and
//! each row's sum is a warp shuffle.
//!
//! Dequantizing without integer-to-float conversions (a slow instruction on
//! the GPU): a value's bits are put in the top of a float's mantissa, which
//! makes `1 + q / 2^bits`, and `Σ q·x = 2^bits · (Σ f·x − Σ x)`; with the
//! group's scale `s` and bias `b`, a chunk adds `s · Σ q·x + b · Σ x`.
//! Sums run in float32, in another order than MLX's kernel: the results
//! agree with `quantized_matmul` to float rounding, not bit for bit.
//!
//! It runs through `mlx::core::fast::cuda_kernel` (mlx-c's
//! `mlx_fast_cuda_kernel_*`), which compiles it with NVRTC on first use and
//! keeps it in MLX's kernel cache; there is no CPU version.

use std::ffi::CString;
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype, Stream};

use crate::config::{QuantMode, QuantParams};
use crate::error::{Error, Result};

/// The most rows of `x` one product takes (a decoding step's batch or a
/// speculative pass's proposals); more go to MLX's `quantized_matmul`.
pub(crate) const MAX_ROWS: i32 = 8;

/// Threads per block: 8 warps.
const BLOCK: i32 = 256;

/// Output rows per warp: `NATIVE_MLX_QMV_ROWS` (1, 2, 4 or 8), default 4.
/// More rows share each converted value of `x` and put more loads in
/// flight per lane, at the cost of registers.
fn rows_per_warp() -> i32 {
    static ROWS: OnceLock<i32> = OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("NATIVE_MLX_QMV_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|r| matches!(r, 1 | 2 | 4 | 8))
            .unwrap_or(4)
    })
}

const HEADER: &str = r#"
template <typename T> struct Load8;
template <> struct Load8<float> {
  __device__ static inline void run(const float* p, float* o) {
    float4 a = *reinterpret_cast<const float4*>(p);
    float4 b = *reinterpret_cast<const float4*>(p + 4);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  }
};
template <> struct Load8<__nv_bfloat16> {
  __device__ static inline void run(const __nv_bfloat16* p, float* o) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = __uint_as_float(w[i] << 16);
      o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <> struct Load8<__half> {
  __device__ static inline void run(const __half* p, float* o) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __half22float2(h[i]);
      o[2 * i] = f.x;
      o[2 * i + 1] = f.y;
    }
  }
};

// R consecutive output rows' 16-byte chunk c of MLX's packed weights (rows
// `(K / (32 / BITS))` words apart from `w`), with the chunk group's scale
// (times 2^BITS) and bias. Rows past N read row N - 1 again (the caller
// writes nothing for them).
template <typename T, int K, int BITS, int GS, int R>
__device__ __forceinline__ void load_chunk(
    const uint32_t* w, const T* scales, const T* biases, int first, int n, int c,
    uint4 (&q)[R], float (&s)[R], float (&b)[R]) {
  constexpr int WORDS = K / (32 / BITS);
  constexpr int GROUPS = K / GS;
  const int g = (c * (128 / BITS)) / GS;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = size_t(min(first + r, n - 1));
    q[r] = __ldg(reinterpret_cast<const uint4*>(w + row * WORDS) + c);
    s[r] = static_cast<float>(scales[row * GROUPS + g]) * float(1 << BITS);
    b[r] = static_cast<float>(biases[row * GROUPS + g]);
  }
}

// Adds the chunk's products with the 128 / BITS values of x at xp to
// acc[r][m]. A value's bits go into the top of a float's mantissa, making
// 1 + q / 2^BITS, so sum(q x) = 2^BITS (sum(f x) - sum(x)), and the group
// adds s sum(q x) + b sum(x).
template <typename T, int BITS, int R, int M>
__device__ __forceinline__ void add_chunk(
    const T* xp, const uint4 (&q)[R], const float (&s)[R], const float (&b)[R],
    float (&acc)[R][M], int m) {
  constexpr int VALS = 128 / BITS;
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  float xv[VALS];
  float xs = 0.0f;
#pragma unroll
  for (int v = 0; v < VALS; v += 8) {
    Load8<T>::run(xp + v, xv + v);
  }
#pragma unroll
  for (int v = 0; v < VALS; ++v) {
    xs += xv[v];
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
    float fx = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < PER_WORD; ++j) {
        const uint32_t bits = (words[i] >> (j * BITS)) & MASK;
        const float f = __uint_as_float(0x3f800000u | (bits << (23 - BITS)));
        fx = fmaf(f, xv[i * PER_WORD + j], fx);
      }
    }
    acc[r][m] = fmaf(s[r], fx - xs, fmaf(b[r], xs, acc[r][m]));
  }
}

// Sums each acc[r][m] over the warp; lane 0 writes the first `rows` rows
// of x (those below N) to y, row m at y + m * n.
template <typename T, int R, int M>
__device__ __forceinline__ void store_rows(
    float (&acc)[R][M], int rows, int first, int n, int lane, T* y) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
      }
      if (lane == 0 && m < rows && first + r < n) {
        y[size_t(m) * n + first + r] = static_cast<T>(v);
      }
    }
  }
}

// Adds chunk q (R output rows) times the first `rows` of the C rows of x
// at xp (rows K apart) to acc[r][j]. Unlike add_chunk, each weight value
// is decoded once for all C rows: a value f = 1 + q / 2^BITS is scaled by
// the group's s' = 2^BITS s, so s' f x = s' x + s q x, and the chunk adds
// the bias less s' times the sum of x. Values go 8 at a time (one 16-byte
// load of each row of x), which keeps C x 8 values of x in registers.
template <typename T, int K, int BITS, int R, int C>
__device__ __forceinline__ void add_chunk_rows(
    const T* xp, int rows, const uint4 (&q)[R], const float (&s)[R], const float (&b)[R],
    float (&acc)[R][C]) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  float xs[C];
#pragma unroll
  for (int j = 0; j < C; ++j) {
    xs[j] = 0.0f;
  }
#pragma unroll
  for (int slice = 0; slice < 16 / BITS; ++slice) {
    float xv[C][8];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if (j < rows) {
        Load8<T>::run(xp + size_t(j) * K + slice * 8, xv[j]);
      } else {
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          xv[j][v] = 0.0f;
        }
      }
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        xs[j] += xv[j][v];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const int at = slice * 8 + v;
        const uint32_t bits = (words[at / PER_WORD] >> ((at % PER_WORD) * BITS)) & MASK;
        const float f = s[r] * __uint_as_float(0x3f800000u | (bits << (23 - BITS)));
#pragma unroll
        for (int j = 0; j < C; ++j) {
          acc[r][j] = fmaf(f, xv[j][v], acc[r][j]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int j = 0; j < C; ++j) {
      acc[r][j] = fmaf(b[r] - s[r], xs[j], acc[r][j]);
    }
  }
}
"#;

/// The kernel's body; `T` (x, scales, biases, y), `M` (rows of x), `K`
/// (inputs), `N` (outputs), `BITS`, `GS` (group size) and `R` (output rows
/// per warp) are template arguments. Each warp takes `R` consecutive output
/// rows: per 16-byte chunk a lane loads `R` independent chunks of weights
/// (more bytes in flight), and each value of `x` is converted and summed
/// once for all `R` rows.
const SOURCE: &str = r#"
  constexpr int CHUNKS = K / (128 / BITS);    // 16-byte loads per row
  const int lane = threadIdx.x & 31;
  const int first = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (first >= N) {
    return;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc[r][m] = 0.0f;
    }
  }
#pragma unroll 2
  for (int c = lane; c < CHUNKS; c += 32) {
    uint4 q[R];
    float s[R], b[R];
    load_chunk<T, K, BITS, GS, R>(w, scales, biases, first, N, c, q, s, b);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      add_chunk<T, BITS, R, M>(x + size_t(m) * K + size_t(c) * (128 / BITS), q, s, b, acc, m);
    }
  }
  store_rows<T, R, M>(acc, M, first, N, lane, y);
"#;

/// The gathered product of MoE experts over rows sorted by expert (what
/// mlx-lm's `SwitchGLU` hands `gather_qmm` from 64 (token, expert) pairs
/// on): `y[i] = x[i] @ W[idx[i]].T` for the `m` rows of `x`, with `idx`
/// ascending. MLX 0.32's CUDA `gather_qmm` runs each row as its own
/// one-row product, so every row reads its expert's whole matrix again: at
/// 64 streams of a 128-expert model each expert's weights were read about
/// four times a layer. Here block `(x, e)` finds expert `e`'s run of rows
/// (a binary search in `idx`, by one thread for the block) and takes them
/// `C` at a time, each weight chunk read, and each value decoded, once for
/// all `C` (`add_chunk_rows`). `x`'s row count comes at run time
/// (`idx_shape[0]`), so one compiled kernel serves every batch.
const GATHER_SOURCE: &str = r#"
  constexpr int CHUNKS = K / (128 / BITS);
  constexpr int WORDS = K / (32 / BITS);
  constexpr int GROUPS = K / GS;
  // Expert e's rows, [span[0], span[1]) of the ascending idx: one thread
  // of the block searches, the others wait for it.
  __shared__ int span[2];
  const int e = blockIdx.y;
  if (threadIdx.x == 0) {
    const int m = idx_shape[0];
    int lo = 0, hi = m;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (int(idx[mid]) < e) { lo = mid + 1; } else { hi = mid; }
    }
    int end = lo;
    hi = m;
    while (end < hi) {
      const int mid = (end + hi) >> 1;
      if (int(idx[mid]) <= e) { end = mid + 1; } else { hi = mid; }
    }
    span[0] = lo;
    span[1] = end;
  }
  __syncthreads();
  const int lo = span[0], end = span[1];
  if (lo == end) {
    return;
  }
  const int lane = threadIdx.x & 31;
  const int first = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const uint32_t* we = w + size_t(e) * N * WORDS;
  const T* se = scales + size_t(e) * N * GROUPS;
  const T* be = biases + size_t(e) * N * GROUPS;
  // With S, a pass's rows of x are copied to shared memory once for the
  // block's warps (where they fit the 48 KB a block may declare), and
  // every warp of the block, past N or not, takes part in the copy.
  constexpr bool STAGE = S != 0 && C * K * sizeof(T) <= 48 * 1024;
  __shared__ __align__(16) T staged[STAGE ? C * K : 1];
  for (int base = lo; base < end; base += C) {
    const int rows = min(C, end - base);
    const T* xr = x + size_t(base) * K;
    if (STAGE) {
      constexpr int VECS = K * sizeof(T) / 16;  // 16-byte copies per row
      __syncthreads();
      for (int i = threadIdx.x; i < rows * VECS; i += blockDim.x) {
        reinterpret_cast<uint4*>(staged)[i] = reinterpret_cast<const uint4*>(xr)[i];
      }
      __syncthreads();
      xr = staged;
    }
    if (first >= N) {
      continue;
    }
    float acc[R][C];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        acc[r][j] = 0.0f;
      }
    }
#pragma unroll 2
    for (int c = lane; c < CHUNKS; c += 32) {
      uint4 q[R];
      float s[R], b[R];
      load_chunk<T, K, BITS, GS, R>(we, se, be, first, N, c, q, s, b);
      add_chunk_rows<T, K, BITS, R, C>(xr + size_t(c) * (128 / BITS), rows, q, s, b, acc);
    }
    store_rows<T, R, C>(acc, rows, first, N, lane, y + size_t(base) * N);
  }
"#;

/// The tile of [`GATHER_SOURCE`]: output rows per warp (`R`), rows of `x`
/// per pass over an expert's weights (`C`), and whether a pass's rows of
/// `x` are staged in shared memory (`S`). `NATIVE_MLX_GATHER_TILE`
/// ("R,C" or "R,C,S": R of 1, 2 or 4, C of 2, 4 or 8, S of 0 or 1),
/// default 2,4,0. R and C multiply the registers a thread holds (`R x C`
/// sums and `C x 8` values of `x`), and more registers mean fewer warps on
/// an SM to hide the loads' latency: 4,8 took 255 registers and spilled
/// (ptxas, sm_90), 2,4 takes about 100. 2,4 was the fastest of 1,4, 2,4
/// and 1,8 on an H100 for every 4-bit product of `--gather-check` from 64
/// tokens on. Staging, written because unstaged each lane reads 8 bytes
/// of `x` per byte of weights at 2,4, has not run on a GPU yet.
fn gather_tile() -> (i32, i32, i32) {
    static TILE: OnceLock<(i32, i32, i32)> = OnceLock::new();
    *TILE.get_or_init(|| {
        std::env::var("NATIVE_MLX_GATHER_TILE")
            .ok()
            .and_then(|v| parse_tile(&v))
            .unwrap_or((2, 4, 0))
    })
}

/// "R,C" or "R,C,S" ([`gather_tile`]), `None` when it is not one.
fn parse_tile(text: &str) -> Option<(i32, i32, i32)> {
    let fields = text
        .split(',')
        .map(|f| f.trim().parse().ok())
        .collect::<Option<Vec<i32>>>()?;
    let tile = match fields[..] {
        [r, c] => (r, c, 0),
        [r, c, s] => (r, c, s),
        _ => return None,
    };
    (matches!(tile.0, 1 | 2 | 4) && matches!(tile.1, 2 | 4 | 8) && matches!(tile.2, 0 | 1))
        .then_some(tile)
}

/// The compiled-on-first-use kernel object (mlx-c's handle to MLX's
/// `CustomKernelFunction`).
pub(crate) struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle owns an immutable `std::function` (names, source,
// header) that MLX only reads when the kernel is applied; applying builds a
// new primitive each time. The engine applies it under its MLX turn
// (src/turn.rs), like every other MLX op.
#[allow(unsafe_code)]
unsafe impl Send for Kernel {}
#[allow(unsafe_code)]
unsafe impl Sync for Kernel {}

/// A kernel object for `source` with these input names and one output `y`.
#[allow(unsafe_code)]
pub(crate) fn new_kernel(name: &str, inputs: &[&str], source: &str) -> Kernel {
    let cstr = |s: &str| CString::new(s).expect("no NUL in the kernel's strings");
    let (name, source, header) = (cstr(name), cstr(source), cstr(HEADER));
    let inputs = inputs.iter().map(|s| cstr(s)).collect::<Vec<_>>();
    let output = cstr("y");
    // SAFETY: every pointer is to a NUL-terminated string alive for the
    // call; mlx-c copies the names and strings into the kernel object (and
    // the string vectors, freed right after).
    unsafe {
        let pointers = inputs.iter().map(|s| s.as_ptr()).collect::<Vec<_>>();
        let input_names = mlx_sys::mlx_vector_string_new_data(
            pointers.as_ptr() as *mut *const std::ffi::c_char,
            pointers.len(),
        );
        let output_names = mlx_sys::mlx_vector_string_new_value(output.as_ptr());
        let kernel = mlx_sys::mlx_fast_cuda_kernel_new(
            name.as_ptr(),
            input_names,
            output_names,
            source.as_ptr(),
            header.as_ptr(),
            true,
            0,
        );
        mlx_sys::mlx_vector_string_free(input_names);
        mlx_sys::mlx_vector_string_free(output_names);
        Kernel(kernel)
    }
}

fn kernel() -> &'static Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    KERNEL.get_or_init(|| new_kernel("hangar_qmv", &["x", "w", "scales", "biases"], SOURCE))
}

fn gather_kernel() -> &'static Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    KERNEL.get_or_init(|| {
        new_kernel(
            "hangar_gather_qmv",
            &["x", "w", "scales", "biases", "idx"],
            GATHER_SOURCE,
        )
    })
}

/// Whether [`qmv`] computes `x @ W.T` for this weight and `x`: affine 4- or
/// 8-bit weights with groups of 32, 64 or 128, `x` of at most
/// [`MAX_ROWS`] rows in the scales' float dtype.
pub(crate) fn fits(x: &Array, weight: &Array, scales: &Array, params: &QuantParams) -> bool {
    let rows = x.size() as i32 / x.dim(-1).max(1);
    reads(x, weight, scales, params) && weight.ndim() == 2 && (1..=MAX_ROWS).contains(&rows)
}

/// Whether the kernels read this weight for this `x`: affine 4- or 8-bit
/// groups of 32, 64 or 128 along rows of `x`'s width (a whole number of
/// 16-byte loads), `x` in the scales' float dtype.
fn reads(x: &Array, weight: &Array, scales: &Array, params: &QuantParams) -> bool {
    let k = x.dim(-1);
    matches!(params.mode, QuantMode::Affine)
        && matches!(params.bits, 4 | 8)
        && matches!(params.group_size, 32 | 64 | 128)
        && k % params.group_size == 0
        && k % (128 / params.bits) == 0
        && weight.dim(-1) * (32 / params.bits) == k
        && x.dtype() == scales.dtype()
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
}

/// `x @ W.T` for an affine-quantized `(N, K)` weight (`weight`, `scales`,
/// `biases` as MLX stores them), `x` of shape `(..., K)` that [`fits`]: the
/// result has shape `(..., N)`, on the current stream.
pub(crate) fn qmv(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: &Array,
    params: &QuantParams,
) -> Result<Array> {
    let k = x.dim(-1);
    let n = weight.dim(0);
    let rows = x.size() as i32 / k;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has a last axis") = n;
    // The kernel reads x as `(rows, K)` and writes `(rows, N)` in order, so
    // it takes x and gives y in their own shapes: no reshapes to encode.
    let r = rows_per_warp();
    launch(Launch {
        kernel: kernel(),
        what: "the quantized matrix-vector kernel (hangar_qmv)",
        inputs: &[x, weight, scales, biases],
        out_shape: &shape,
        dtype: x.dtype(),
        grid: ((n + r - 1) / r * 32, 1),
        ints: &[
            ("M", rows),
            ("K", k),
            ("N", n),
            ("BITS", params.bits),
            ("GS", params.group_size),
            ("R", r),
        ],
    })
}

/// Whether [`gather_qmv`] computes this sorted gathered product: stacked
/// `(E, N, K)` affine 4- or 8-bit experts with groups of 32, 64 or 128,
/// `x` `(m, 1, K)` in the scales' float dtype, `indices` `(m,)` of `uint32`.
pub(crate) fn gather_fits(
    x: &Array,
    weight: &Array,
    scales: &Array,
    indices: &Array,
    params: &QuantParams,
) -> bool {
    reads(x, weight, scales, params)
        && weight.ndim() == 3
        && x.ndim() == 3
        && x.dim(1) == 1
        && indices.ndim() == 1
        && indices.dim(0) == x.dim(0)
        && indices.dtype() == Dtype::Uint32
}

/// Whether [`gather_qmv`] was measured faster than MLX's `gather_qmm` for
/// a product it [`gather_fits`]: 4-bit experts with at least two rows of
/// `x` per expert on average. On an H100 (`--gather-check`, tile 2,4) it
/// took 0.69x and 0.91x of MLX's time for Qwen3-30B-A3B's products at 64
/// tokens (4 rows per expert) and 0.44x-0.56x at 512, but 1.7x-2.1x of it
/// at 8 tokens (half a row per expert), where MLX's one-row products read
/// only the experts in use; 8-bit, its 768-wide down projection took 1.8x
/// at 64 tokens. (gpt-oss-20b's 32 experts at 8 tokens, one row each:
/// 0.85x, left to MLX by this rule.)
pub(crate) fn gather_pays(x: &Array, weight: &Array, params: &QuantParams) -> bool {
    params.bits == 4 && x.dim(0) >= 2 * weight.dim(0)
}

/// `y[i] = x[i] @ W[indices[i]].T` for stacked affine-quantized experts
/// (`weight` `(E, N, K / per word)`, `scales`, `biases` as MLX stores
/// them), `x` `(m, 1, K)` and `indices` `(m,)` ascending, as
/// `gather_qmm(..., sorted_indices = true)` takes them ([`gather_fits`]):
/// the result is `(m, 1, N)`, on the current stream.
pub(crate) fn gather_qmv(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: &Array,
    indices: &Array,
    params: &QuantParams,
) -> Result<Array> {
    let (m, k) = (x.dim(0), x.dim(-1));
    let (experts, n) = (weight.dim(0), weight.dim(1));
    let (r, c, stage) = gather_tile();
    // x `(m, 1, K)` is read as `(m, K)` and y written as `(m, N)`, in order.
    launch(Launch {
        kernel: gather_kernel(),
        what: "the gathered quantized kernel (hangar_gather_qmv)",
        inputs: &[x, weight, scales, biases, indices],
        out_shape: &[m, 1, n],
        dtype: x.dtype(),
        grid: ((n + r - 1) / r * 32, experts),
        ints: &[
            ("K", k),
            ("N", n),
            ("BITS", params.bits),
            ("GS", params.group_size),
            ("R", r),
            ("C", c),
            ("S", stage),
        ],
    })
}

/// One application of a kernel object with one output `y`. MLX copies an
/// input that is not row-contiguous into a row-contiguous one (the kernel
/// objects are made with `ensure_row_contiguous`), so a kernel reads each
/// input in its logical order, whatever its shape or strides.
pub(crate) struct Launch<'a> {
    pub(crate) kernel: &'static Kernel,
    pub(crate) what: &'static str,
    pub(crate) inputs: &'a [&'a Array],
    pub(crate) out_shape: &'a [i32],
    /// Of the output and the template argument `T`.
    pub(crate) dtype: Dtype,
    /// Threads along x (blocks of [`BLOCK`]) and blocks along y.
    pub(crate) grid: (i32, i32),
    pub(crate) ints: &'a [(&'static str, i32)],
}

#[allow(unsafe_code)]
pub(crate) fn launch(l: Launch<'_>) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let failed = || {
        Error::Mlx(mlx_rs::error::Exception::custom(format!(
            "{} failed",
            l.what
        )))
    };
    let dtype = l.dtype as u32 as mlx_sys::mlx_dtype;
    // SAFETY: the config, the input vector and the output vector are
    // created, used and freed here; the inputs are borrowed from live
    // arrays for the call (mlx-c copies the handles it keeps); the one
    // output handle is taken out of the vector with `mlx_vector_array_get`
    // into a fresh handle that `Array::from_ptr` then owns.
    unsafe {
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let mut status = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            config,
            l.out_shape.as_ptr(),
            l.out_shape.len(),
            dtype,
        );
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, l.grid.0, l.grid.1, 1);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, BLOCK, 1, 1);
        let t = CString::new("T").expect("no NUL");
        status |=
            mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(config, t.as_ptr(), dtype);
        for &(name, value) in l.ints {
            let name = CString::new(name).expect("no NUL");
            status |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                config,
                name.as_ptr(),
                value,
            );
        }
        let handles = l.inputs.iter().map(|a| a.as_ptr()).collect::<Vec<_>>();
        let inputs = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let mut outputs = mlx_sys::mlx_vector_array_new();
        if status == 0 {
            status = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut outputs as *mut _,
                l.kernel.0,
                inputs,
                config,
                stream.as_ptr(),
            );
        }
        let mut y = mlx_sys::mlx_array_new();
        if status == 0 && mlx_sys::mlx_vector_array_size(outputs) == 1 {
            status = mlx_sys::mlx_vector_array_get(&mut y as *mut _, outputs, 0);
        } else if status == 0 {
            status = 1;
        }
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_vector_array_free(outputs);
        mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        if status != 0 {
            mlx_sys::mlx_array_free(y);
            return Err(failed());
        }
        Ok(Array::from_ptr(y))
    }
}

/// [`qmv`] against MLX's `quantized_matmul` on one random weight
/// (`native-mlx-bench --qmv-check`).
#[derive(Debug, Clone, Copy)]
pub struct QmvCheck {
    /// Microseconds per product: MLX's kernel, then this one (`repeats`
    /// products submitted at once, so the GPU's time dominates).
    pub mlx_us: f64,
    pub custom_us: f64,
    /// The largest difference from MLX's result, relative to its largest
    /// magnitude.
    pub max_error: f32,
    /// Bytes of the packed weight, scales and biases (what one product reads).
    pub weight_bytes: usize,
}

/// One product for [`check_qmv`]: an `(n, k)` weight quantized to `bits`
/// with `group_size`, times `rows` rows of `x`.
#[derive(Debug, Clone, Copy)]
pub struct QmvShape {
    pub k: i32,
    pub n: i32,
    pub rows: i32,
    pub bits: i32,
    pub group_size: i32,
}

/// Checks and times [`qmv`] for `shape` with `x` in `dtype`: `repeats`
/// products of each kernel per timed evaluation, the median of `rounds`
/// evaluations.
#[doc(hidden)]
pub fn check_qmv(shape: QmvShape, dtype: Dtype, repeats: usize, rounds: usize) -> Result<QmvCheck> {
    let QmvShape {
        k,
        n,
        rows,
        bits,
        group_size,
    } = shape;
    use mlx_rs::ops::{quantize, quantized_matmul};
    use mlx_rs::random::normal;
    use mlx_rs::transforms::eval;
    let w = normal::<f32>(&[n, k][..], None, 0.02, None)?.as_dtype(dtype)?;
    let (weight, scales, biases) = quantize(&w, group_size, bits)?;
    let x = normal::<f32>(&[1, rows, k][..], None, None, None)?.as_dtype(dtype)?;
    eval([&weight, &scales, &biases, &x])?;
    drop(w);
    let params = QuantParams {
        group_size,
        bits,
        mode: QuantMode::Affine,
    };
    if !fits(&x, &weight, &scales, &params) {
        return Err(Error::Mlx(mlx_rs::error::Exception::custom(format!(
            "hangar_qmv does not take k {k}, {rows} rows, {bits} bits, groups of {group_size}, {dtype:?}"
        ))));
    }
    let weight_bytes = weight.nbytes() + scales.nbytes() + biases.nbytes();
    compare(
        &x,
        &|x| quantized_matmul(x, &weight, &scales, &biases, true, group_size, bits),
        &|x| qmv(x, &weight, &scales, &biases, &params),
        weight_bytes,
        repeats,
        rounds,
    )
}

/// One sorted gathered product for [`check_gather_qmv`]: `experts` stacked
/// `(n, k)` weights quantized to `bits` with `group_size`, and `rows` rows
/// of `x` (tokens times experts per token), each with a pseudo-random
/// expert, sorted by expert.
#[derive(Debug, Clone, Copy)]
pub struct GatherShape {
    pub experts: i32,
    pub k: i32,
    pub n: i32,
    pub rows: i32,
    pub bits: i32,
    pub group_size: i32,
}

/// Checks and times [`gather_qmv`] against MLX's
/// `gather_qmm(..., sorted_indices = true)`, as [`check_qmv`] does;
/// `weight_bytes` counts the experts the rows use.
#[doc(hidden)]
pub fn check_gather_qmv(
    shape: GatherShape,
    dtype: Dtype,
    repeats: usize,
    rounds: usize,
) -> Result<QmvCheck> {
    let GatherShape {
        experts,
        k,
        n,
        rows,
        bits,
        group_size,
    } = shape;
    use mlx_rs::ops::{gather_qmm, quantize};
    use mlx_rs::random::normal;
    use mlx_rs::transforms::eval;
    let w = normal::<f32>(&[experts, n, k][..], None, 0.02, None)?.as_dtype(dtype)?;
    let (weight, scales, biases) = quantize(&w, group_size, bits)?;
    let x = normal::<f32>(&[rows, 1, k][..], None, None, None)?.as_dtype(dtype)?;
    // A fixed linear congruential sequence: the same experts every run.
    let mut state = 0x2545_f491_u64;
    let mut chosen = (0..rows)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % experts as u64) as u32
        })
        .collect::<Vec<_>>();
    chosen.sort_unstable();
    let used = {
        let mut distinct = chosen.clone();
        distinct.dedup();
        distinct.len()
    };
    let indices = Array::from_slice(&chosen, &[rows]);
    eval([&weight, &scales, &biases, &x, &indices])?;
    drop(w);
    let params = QuantParams {
        group_size,
        bits,
        mode: QuantMode::Affine,
    };
    if !gather_fits(&x, &weight, &scales, &indices, &params) {
        return Err(Error::Mlx(mlx_rs::error::Exception::custom(format!(
            "hangar_gather_qmv does not take k {k}, {bits} bits, groups of {group_size}, {dtype:?}"
        ))));
    }
    let weight_bytes =
        (weight.nbytes() + scales.nbytes() + biases.nbytes()) / experts as usize * used;
    compare(
        &x,
        &|x| {
            gather_qmm(
                x, &weight, &scales, &biases, None, &indices, true, group_size, bits, true,
            )
        },
        &|x| gather_qmv(x, &weight, &scales, &biases, &indices, &params),
        weight_bytes,
        repeats,
        rounds,
    )
}

/// `ours` against `reference` on `x`: the largest difference relative to
/// the reference's largest magnitude, and each one's median microseconds
/// per product over `rounds` evaluations of `repeats` products at once.
fn compare(
    x: &Array,
    reference: &dyn Fn(&Array) -> mlx_rs::error::Result<Array>,
    ours: &dyn Fn(&Array) -> Result<Array>,
    weight_bytes: usize,
    repeats: usize,
    rounds: usize,
) -> Result<QmvCheck> {
    use mlx_rs::ops::{abs, max};
    use mlx_rs::transforms::eval;
    let expected = reference(x)?.as_dtype(Dtype::Float32)?;
    let got = ours(x)?.as_dtype(Dtype::Float32)?;
    let scale = max(&abs(&expected)?, None)?;
    let error = max(&abs(&got.subtract(&expected)?)?, None)?.divide(&scale)?;
    eval([&error])?;
    let max_error = error.item_cast::<f32>();
    let time = |f: &dyn Fn(&Array) -> Result<Array>| -> Result<f64> {
        let mut times = Vec::new();
        for round in 0..=rounds {
            let started = std::time::Instant::now();
            let outputs = (0..repeats).map(|_| f(x)).collect::<Result<Vec<_>>>()?;
            eval(outputs.iter())?;
            if round > 0 {
                times.push(started.elapsed().as_secs_f64() * 1e6 / repeats as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    };
    let mlx_us = time(&|x| Ok(reference(x)?))?;
    let custom_us = time(ours)?;
    Ok(QmvCheck {
        mlx_us,
        custom_us,
        max_error,
        weight_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gathered_kernel_is_chosen_for_4_bits_at_two_rows_per_expert() {
        let params = |bits| QuantParams {
            group_size: 64,
            bits,
            mode: QuantMode::Affine,
        };
        // Experts as MLX stores them: (experts, out, in / values per word).
        let weight = Array::zeros::<u32>(&[16, 8, 32]).unwrap();
        let x = |rows| Array::zeros::<f32>(&[rows, 1, 256]).unwrap();
        assert!(gather_pays(&x(32), &weight, &params(4)));
        assert!(gather_pays(&x(100), &weight, &params(4)));
        assert!(!gather_pays(&x(31), &weight, &params(4)));
        assert!(!gather_pays(&x(64), &weight, &params(8)));
    }

    #[test]
    fn a_gathered_tile_is_two_or_three_numbers_in_range() {
        assert_eq!(parse_tile("2,4"), Some((2, 4, 0)));
        assert_eq!(parse_tile(" 1, 8 ,1"), Some((1, 8, 1)));
        for bad in ["", "2", "3,4", "2,16", "2,4,2", "2,4,0,1", "a,4"] {
            assert_eq!(parse_tile(bad), None, "{bad:?}");
        }
    }
}
