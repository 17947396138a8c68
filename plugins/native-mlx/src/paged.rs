//! A CUDA attention kernel for the batching engine's decoding rows that
//! reads keys and values straight from the paged pool (`src/pool.rs`)
//! through each row's page table: one kernel a layer for every decoding
//! row, whatever its length.
//!
//! Without it a decoding group gathers its rows' keys and values padded to
//! a bucket and attends under a mask, and MLX 0.32's CUDA attention has no
//! kernel for a masked query of one token, so it runs the masked softmax
//! as separate ops: some 30 primitives a group and layer, each a few
//! microseconds of host work, where the host is what bounds a batched step
//! (an H100 at 7B: 1 719 primitives a step in one group, 9.6 ms at 8 rows
//! against 5.9 ms for one row alone).
//!
//! One block per row and key/value head: its 8 warps share the row's
//! positions, each lane holding `D / 32` values of each of the head's
//! query heads; scores and the softmax run in float32, online (a running
//! maximum and sum), and the warps' partial sums are joined in shared
//! memory. MLX's masked fallback rounds the scaled queries, the scores and
//! the weights to the model's type: the results agree with it to that
//! rounding, not bit for bit, so the batching engine takes it only where
//! asked (`BatchOptions::paged_attention`). GPU only.

use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use crate::error::Result;
use crate::indexing::IndexOnStream;
use crate::pool::PAGE;
use crate::qmv::{launch, new_kernel, Kernel, Launch};

const SOURCE: &str = r#"
  constexpr int E = D / 32;
  constexpr int WARPS = 8;
  const float NEG_INF = __int_as_float(0xff800000);
  const int row = blockIdx.y / KVH;
  const int kvh = blockIdx.y % KVH;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int len = lens[row];
  const int pages = table_shape[1];
  const long rows = k_shape[1];
  const float sc = scale[0];
  float qv[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qv[g][e] = static_cast<float>(q[((long)row * KVH * G + kvh * G + g) * D + e * 32 + lane]) * sc;
    }
  }
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = NEG_INF;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.f;
  }
  const T* kh = k + (long)kvh * rows * D;
  const T* vh = v + (long)kvh * rows * D;
  for (int j = warp; j < len; j += WARPS) {
    const long r = (long)table[row * pages + j / PAGE] * PAGE + j % PAGE;
    float kx[E], vx[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kx[e] = static_cast<float>(kh[r * D + e * 32 + lane]);
      vx[e] = static_cast<float>(vh[r * D + e * 32 + lane]);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) s += qv[g][e] * kx[e];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      const float mn = fmaxf(m[g], s);
      const float c = expf(m[g] - mn);
      const float p = expf(s - mn);
      l[g] = l[g] * c + p;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * c + p * vx[e];
      m[g] = mn;
    }
  }
  __shared__ float sm[WARPS][G];
  __shared__ float sl[WARPS][G];
  __shared__ float sacc[WARPS][G][D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm[warp][g] = m[g];
      sl[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) sacc[warp][g][e * 32 + lane] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = NEG_INF;
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm[w][g]);
    float total = 0.f, out = 0.f;
    for (int w = 0; w < WARPS; ++w) {
      const float f = sm[w][g] == NEG_INF ? 0.f : expf(sm[w][g] - mx);
      total += sl[w][g] * f;
      out += sacc[w][g][d] * f;
    }
    y[((long)row * KVH * G + kvh * G + g) * D + d] = static_cast<T>(out / total);
  }
"#;

fn kernel() -> &'static Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    KERNEL.get_or_init(|| {
        new_kernel(
            "hangar_paged_attention",
            &["q", "k", "v", "table", "lens", "scale"],
            SOURCE,
        )
    })
}

/// Whether [`attention`] computes this: queries `(n, heads, 1, D)` and a
/// pool `(kv_heads, rows, D)` of one float type, `D` 64 or 128, at most 8
/// query heads per key/value head (the block's shared memory).
pub(crate) fn fits(queries: &Array, pool: &(Array, Array), kv_heads: i32) -> bool {
    let (heads, d) = (queries.dim(1), queries.dim(-1));
    queries.ndim() == 4
        && queries.dim(2) == 1
        && takes_heads(heads, kv_heads, d)
        && pool.0.dim(2) == d
        && pool.1.dim(2) == d
        && pool.0.dim(0) == kv_heads
        && pool.0.dtype() == queries.dtype()
        && pool.1.dtype() == queries.dtype()
        && matches!(
            queries.dtype(),
            Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32
        )
}

/// Whether the kernel takes `heads` query heads of `head_dim` over
/// `kv_heads` key/value heads.
pub(crate) fn takes_heads(heads: i32, kv_heads: i32, head_dim: i32) -> bool {
    matches!(head_dim, 64 | 128) && kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 8
}

/// Whether [`attention`] is taken for `rows` decoding rows of `kv_heads`
/// heads, the longest reading `longest` positions: its blocks (one per
/// row and key/value head) fill an H100's or H200's 132 multiprocessors
/// twice, or no row is long. It was measured at 64-256 positions only; a
/// few rows thousands of positions long would leave most of the GPU idle
/// (a split over positions would not), and keep the groups.
pub(crate) fn pays(rows: i32, kv_heads: i32, longest: i32) -> bool {
    rows * kv_heads >= 256 || longest <= 4096
}

/// Row `i` of `queries` (`(n, heads, 1, D)`, [`fits`]) attends to the
/// first `lens[i]` positions of its sequence, position `p` at pool row
/// `table[i, p / PAGE] * PAGE + p % PAGE` of `pool` (keys and values
/// `(kv_heads, rows, D)`), scores scaled by `scale`. Returns `(1, n, heads
/// * D)`, query heads in order, on the current stream.
pub(crate) fn attention(
    queries: &Array,
    pool: &(Array, Array),
    table: &Array,
    lens: &Array,
    scale: f32,
    kv_heads: i32,
) -> Result<Array> {
    let (n, heads, d) = (queries.dim(0), queries.dim(1), queries.dim(-1));
    let scale = Array::from_slice(&[scale], &[1]);
    // The kernel reads the queries as `(n, heads * d)` and writes its rows
    // in order: it takes them and gives `(1, n, heads * d)` with no
    // reshapes to encode (a strided view of them is copied by MLX).
    launch(Launch {
        kernel: kernel(),
        what: "the paged attention kernel (hangar_paged_attention)",
        inputs: &[queries, &pool.0, &pool.1, table, lens, &scale],
        out_shape: &[1, n, heads * d],
        dtype: queries.dtype(),
        grid: (256, n * kv_heads),
        ints: &[
            ("D", d),
            ("G", heads / kv_heads),
            ("KVH", kv_heads),
            ("PAGE", PAGE),
        ],
    })
}

/// [`attention`] against the same attention computed by MLX's ops in
/// float32 (each row's positions gathered, scores, softmax, values), on
/// random queries and pools of `dtype` whose pages are spread over the pool
/// in a shuffled order: the largest difference relative to the largest
/// magnitude of the result (`native-mlx-bench --paged-check`; GPU only).
pub fn check(heads: i32, kv_heads: i32, d: i32, lens: &[i32], dtype: Dtype) -> Result<f32> {
    use mlx_rs::ops::indexing::take_axis;
    use mlx_rs::ops::{concatenate, softmax_axis};
    use mlx_rs::random::normal;
    let n = lens.len() as i32;
    let pages: Vec<i32> = lens.iter().map(|&l| (l + PAGE - 1) / PAGE).collect();
    let total: i32 = pages.iter().sum::<i32>() + 3;
    // The rows take the pool's pages from the last down.
    let order: Vec<i32> = (0..total).rev().collect();
    let width = pages.iter().copied().max().unwrap_or(1);
    let (mut table, mut next) = (Vec::new(), 0usize);
    for &held in &pages {
        for i in 0..width {
            table.push(if i < held {
                next += 1;
                order[next - 1]
            } else {
                0
            });
        }
    }
    let rows = total * PAGE;
    let queries = normal::<f32>(&[n, heads, 1, d], None, None, None)?.as_dtype(dtype)?;
    let keys = normal::<f32>(&[kv_heads, rows, d], None, None, None)?.as_dtype(dtype)?;
    let values = normal::<f32>(&[kv_heads, rows, d], None, None, None)?.as_dtype(dtype)?;
    let scale = 1.0 / (d as f32).sqrt();
    let out = attention(
        &queries,
        &(keys.clone(), values.clone()),
        &Array::from_slice(&table, &[n, width]),
        &Array::from_slice(lens, &[n]),
        scale,
        kv_heads,
    )?
    .as_dtype(Dtype::Float32)?;
    // Custom kernels run on a GPU only: elsewhere this is the error.
    mlx_rs::transforms::eval([&out])?;
    let (keys, values) = (
        keys.as_dtype(Dtype::Float32)?,
        values.as_dtype(Dtype::Float32)?,
    );
    let g = heads / kv_heads;
    let mut expected = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let at: Vec<i32> = (0..len)
            .map(|p| table[i * width as usize + (p / PAGE) as usize] * PAGE + p % PAGE)
            .collect();
        let at = Array::from_slice(&at, &[len]);
        let k = take_axis(&keys, &at, 1)?;
        let v = take_axis(&values, &at, 1)?;
        let q = queries
            .at(i as i32)?
            .as_dtype(Dtype::Float32)?
            .reshape(&[kv_heads, g, d])?
            .multiply(Array::from_f32(scale))?;
        let weights = softmax_axis(&q.matmul(&k.transpose_axes(&[0, 2, 1])?)?, -1, None)?;
        expected.push(weights.matmul(&v)?.reshape(&[1, 1, heads * d])?);
    }
    let expected = concatenate(&expected, 1)?;
    let largest = expected.abs()?.max(None)?.item_cast::<f32>();
    let diff = out
        .subtract(&expected)?
        .abs()?
        .max(None)?
        .item_cast::<f32>();
    Ok(diff / largest)
}

#[cfg(test)]
mod tests {
    use super::{pays, takes_heads};

    #[test]
    fn a_few_long_rows_keep_the_groups() {
        assert!(pays(64, 4, 100_000));
        assert!(pays(2, 4, 4096));
        assert!(!pays(2, 4, 4097));
    }

    #[test]
    fn heads_of_64_and_128_in_groups_of_up_to_8() {
        // Qwen2.5 7B and 0.5B, Llama 3 8B.
        assert!(takes_heads(28, 4, 128) && takes_heads(14, 2, 64) && takes_heads(32, 8, 128));
        // Phi-3's 96, Gemma 3's 256, groups of 16, uneven groups.
        assert!(!takes_heads(32, 32, 96) && !takes_heads(8, 4, 256));
        assert!(!takes_heads(32, 2, 128) && !takes_heads(28, 3, 128) && !takes_heads(8, 0, 64));
    }
}
