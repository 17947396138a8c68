//! The crate's only unsafe code: the few things mlx-rs does not offer safely.

use std::ffi::{CStr, CString};

use mlx_rs::{Array, Stream};

use crate::config::QuantParams;
use crate::error::{Error, Result};

/// Hands the buffers MLX keeps for reuse (those of arrays freed since)
/// back to the device: an engine gone idle then holds its weights alone,
/// and another engine on the same GPU (an `mlx_lm.server`, another model)
/// can use the rest (mlx-rs does not wrap `mlx_clear_cache`).
#[allow(unsafe_code)]
pub(crate) fn release_cached_buffers() {
    // SAFETY: it takes no arguments; MLX's allocator frees, under its own
    // lock, only buffers no array uses.
    unsafe {
        mlx_sys::mlx_clear_cache();
    }
}

/// The version string of the loaded `libmlx` (mlx-rs does not wrap `mlx_version`).
#[allow(unsafe_code)]
pub(crate) fn mlx_version() -> Result<String> {
    // SAFETY: mlx_string_new returns an empty, owned string handle;
    // mlx_version fills it and reports failure through its return code;
    // mlx_string_data points into the handle, which stays alive until
    // mlx_string_free below, after the bytes were copied into a String.
    unsafe {
        let mut handle = mlx_sys::mlx_string_new();
        let status = mlx_sys::mlx_version(&mut handle as *mut _);
        let version = if status == 0 {
            let data = mlx_sys::mlx_string_data(handle);
            (!data.is_null()).then(|| CStr::from_ptr(data).to_string_lossy().into_owned())
        } else {
            None
        };
        mlx_sys::mlx_string_free(handle);
        version.ok_or_else(|| {
            Error::Mlx(mlx_rs::error::Exception::custom(
                "mlx_version failed to report the MLX version",
            ))
        })
    }
}

/// `src` with `update` written over the block `start..stop` (every stride
/// 1): MLX's `slice_update`, one op. mlx-rs's `index_mut` reaches it too,
/// but for an update with leading axes of size 1 (a decoding step's `(1,
/// kv_heads, 1, head_dim)` keys) it adds a reshape dropping them and one
/// putting them back: two more ops to build and run per write, four per
/// layer and step of a sequence's cache.
#[allow(unsafe_code)]
pub(crate) fn slice_update(
    src: &Array,
    update: &Array,
    start: &[i32],
    stop: &[i32],
) -> Result<Array> {
    let strides = vec![1; start.len()];
    let stream = Stream::thread_local_or_default();
    // SAFETY: the handles are borrowed from live arrays and the bounds from
    // live slices for the duration of the call; MLX copies what it keeps
    // and writes the result into `res` only.
    mlx_op("slice_update", |res| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        )
    })
}

/// How many primitives the graph of `outputs` holds, by name, from MLX's
/// `export_to_dot` (every node not yet evaluated; arrays already evaluated
/// are the graph's inputs, not counted): what building and submitting it
/// costs the host, op by op. A diagnostic (`native-mlx-bench --graph-ops`).
#[allow(unsafe_code)]
pub(crate) fn graph_primitives(
    outputs: &[&Array],
) -> Result<std::collections::BTreeMap<String, usize>> {
    let failed = |what: &str| Error::Mlx(mlx_rs::error::Exception::custom(what.to_string()));
    let path = std::env::temp_dir().join(format!(
        "native-mlx-graph-{}-{:?}.dot",
        std::process::id(),
        std::thread::current().id()
    ));
    let c_path = CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| failed("a temp path with NUL"))?;
    let mode = CString::new("w").expect("no NUL");
    // SAFETY: the file handle is opened, written by MLX and closed here; the
    // vector and namer are created and freed here; the array handles are
    // borrowed from live arrays for the call.
    let status = unsafe {
        let file = mlx_sys::fopen(c_path.as_ptr(), mode.as_ptr());
        if file.is_null() {
            return Err(failed("cannot open a temp file for the graph"));
        }
        let handles = outputs.iter().map(|a| a.as_ptr()).collect::<Vec<_>>();
        let vector = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_export_to_dot(file, namer, vector);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vector);
        mlx_sys::fclose(file);
        status
    };
    let text = std::fs::read_to_string(&path);
    let _ = std::fs::remove_file(&path);
    if status != 0 {
        return Err(failed("MLX's export_to_dot failed"));
    }
    let text = text.map_err(|e| failed(&format!("cannot read the graph back: {e}")))?;
    // A primitive's node: `"name" [label ="Primitive", shape=rectangle]`.
    let mut counts = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("shape=rectangle")) {
        if let Some(label) = line
            .split("label =\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        {
            *counts.entry(label.to_string()).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// A quantized weight as MLX's quantized ops take it, for a `mode` that
/// mlx-rs 0.33 does not pass (its `quantized_matmul`, `gather_qmm` and
/// `dequantize` always ask for "affine"): MXFP4, gpt-oss's experts.
pub(crate) struct Packed<'a> {
    pub(crate) weight: &'a Array,
    pub(crate) scales: &'a Array,
    /// Affine mode's per-group biases; other modes have none.
    pub(crate) biases: Option<&'a Array>,
    pub(crate) params: QuantParams,
}

/// Runs one MLX C op that writes its result into a new array handle.
#[allow(unsafe_code)]
fn mlx_op(what: &str, op: impl FnOnce(*mut mlx_sys::mlx_array) -> i32) -> Result<Array> {
    // SAFETY: `res` is a fresh, empty handle that the op fills; on success
    // `Array::from_ptr` takes ownership of it (and frees it on drop), on
    // failure it is freed here and never used.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if op(&mut res as *mut _) != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Error::Mlx(mlx_rs::error::Exception::custom(format!(
                "MLX's {what} failed"
            ))));
        }
        Ok(Array::from_ptr(res))
    }
}

impl Packed<'_> {
    fn mode(&self) -> CString {
        CString::new(self.params.mode.name()).expect("a mode name has no NUL")
    }

    fn int(value: i32) -> mlx_sys::mlx_optional_int {
        mlx_sys::mlx_optional_int {
            value,
            has_value: true,
        }
    }

    /// `x @ W.T` (`mx.quantized_matmul(..., transpose=True, mode=...)`).
    #[allow(unsafe_code)]
    pub(crate) fn matmul(&self, x: &Array) -> Result<Array> {
        let (mode, stream) = (self.mode(), Stream::thread_local_or_default());
        // SAFETY: every handle is borrowed from a live `Array` (or is the
        // empty handle MLX reads as "none") for the duration of the call; the
        // mode string outlives it; MLX writes the result into `res` only.
        mlx_op("quantized_matmul", |res| unsafe {
            mlx_sys::mlx_quantized_matmul(
                res,
                x.as_ptr(),
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                self.biases
                    .map_or_else(|| mlx_sys::mlx_array_new(), Array::as_ptr),
                true,
                Self::int(self.params.group_size),
                Self::int(self.params.bits),
                mode.as_ptr(),
                stream.as_ptr(),
            )
        })
    }

    /// `x @ W[e].T` for the experts `indices` of each row of `x`
    /// (`mx.gather_qmm(..., rhs_indices=indices, transpose=True, mode=...)`).
    #[allow(unsafe_code)]
    pub(crate) fn gather_matmul(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let (mode, stream) = (self.mode(), Stream::thread_local_or_default());
        // SAFETY: as in `matmul`; the empty left-hand indices mean "none".
        mlx_op("gather_qmm", |res| unsafe {
            mlx_sys::mlx_gather_qmm(
                res,
                x.as_ptr(),
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                self.biases
                    .map_or_else(|| mlx_sys::mlx_array_new(), Array::as_ptr),
                mlx_sys::mlx_array_new(),
                indices.as_ptr(),
                true,
                Self::int(self.params.group_size),
                Self::int(self.params.bits),
                mode.as_ptr(),
                sorted,
                stream.as_ptr(),
            )
        })
    }

    /// The weights as floats (`mx.dequantize(..., mode=...)`), in the
    /// dtype MLX picks from the scales.
    #[allow(unsafe_code)]
    pub(crate) fn dequantize(&self) -> Result<Array> {
        let (mode, stream) = (self.mode(), Stream::thread_local_or_default());
        // SAFETY: as in `matmul`; no global scale, no dtype asked for.
        mlx_op("dequantize", |res| unsafe {
            mlx_sys::mlx_dequantize(
                res,
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                self.biases
                    .map_or_else(|| mlx_sys::mlx_array_new(), Array::as_ptr),
                Self::int(self.params.group_size),
                Self::int(self.params.bits),
                mode.as_ptr(),
                mlx_sys::mlx_array_new(),
                mlx_sys::mlx_optional_dtype {
                    value: mlx_sys::mlx_dtype__MLX_FLOAT32,
                    has_value: false,
                },
                stream.as_ptr(),
            )
        })
    }
}

/// MLX's switch for the CUDA backend's graph-cache check.
const THRASHING_CHECK: &str = "MLX_ENABLE_CACHE_THRASHING_CHECK";

/// MLX settings a serving engine needs, applied before MLX builds a stream
/// (it reads them as each stream's command encoder is made).
///
/// MLX's CUDA backend caches captured graphs per stream and, by default,
/// throws once that cache has missed more than twice its capacity over the
/// process's life (a count that is never reset). Continuous batching changes
/// the graph from step to step (sequences join and leave, each attends over
/// its own cache), so a served engine passes that count: on an H200 at 64
/// streams every request failed with "Cache thrashing is happening" within
/// one run of 8 192 tokens, and the throw ends the engine. The check warns
/// of speed lost, not of wrong results, so it is off unless the operator set
/// it (MLX's own test runner turns it off the same way).
fn serving_defaults() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os(THRASHING_CHECK).is_none() {
            std::env::set_var(THRASHING_CHECK, "0");
        }
    });
}

/// An MLX stream that any thread may use, one thread at a time.
///
/// Since MLX 0.32 streams are thread-affine: one made by `new_stream`, and
/// each thread's default stream, only work on the thread that made them.
/// A session must survive moving to another thread (a host runs it on a
/// worker), so it does all its work on streams made with
/// `new_thread_unsafe_stream` instead, which MLX lets any thread use as long
/// as graphs are not built and evaluated on them concurrently; `&mut self`
/// on generation guarantees that.
pub(crate) struct SendStream(pub(crate) Stream);

impl SendStream {
    /// A new thread-unsafe stream on the CPU (`cpu`) or the default device.
    #[allow(unsafe_code)]
    pub(crate) fn new(cpu: bool) -> Result<Self> {
        serving_defaults();
        // This thread's default stream of the wanted device: it names the
        // device, and its heap object receives the new stream below.
        let stream = if cpu { Stream::cpu() } else { Stream::new() };
        let failed = |what: &str| Error::Mlx(mlx_rs::error::Exception::custom(what));
        // SAFETY: `device` is created, filled and freed here. `fresh` is a
        // new handle (`ctx` null when MLX reported an error through mlx-rs's
        // handler, which creating `stream` installed); its value is copied
        // into `stream`'s own `mlx::core::Stream` (mlx_stream_set assigns
        // through `ctx`, which `stream` keeps owning and frees on drop), then
        // it is freed.
        unsafe {
            let mut device = mlx_sys::mlx_device_new();
            if mlx_sys::mlx_stream_get_device(&mut device as *mut _, stream.as_ptr()) != 0 {
                mlx_sys::mlx_device_free(device);
                return Err(failed("MLX could not tell a stream's device"));
            }
            let fresh = mlx_sys::mlx_stream_new_thread_unsafe(device);
            mlx_sys::mlx_device_free(device);
            if fresh.ctx.is_null() {
                return Err(failed("MLX could not create a stream"));
            }
            let mut target = stream.as_ptr();
            let status = mlx_sys::mlx_stream_set(&mut target as *mut _, fresh);
            mlx_sys::mlx_stream_free(fresh);
            if status != 0 {
                return Err(failed("MLX could not set up a stream"));
            }
        }
        Ok(Self(stream))
    }
}

impl Clone for SendStream {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

// SAFETY: the wrapped handle points to a heap-allocated `mlx::core::Stream`
// (an index and a device) that it owns exclusively, and the stream itself
// was made thread-unsafe (usable from any thread, see above); the crate
// never builds or evaluates graphs on it from two threads at once.
#[allow(unsafe_code)]
unsafe impl Send for SendStream {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_made_with_the_graph_cache_check_decided() {
        let before = std::env::var_os(THRASHING_CHECK);
        SendStream::new(true).unwrap();
        // Off unless the environment had decided before (this process's
        // first stream may have been made by another test).
        let after = std::env::var_os(THRASHING_CHECK);
        match before {
            Some(set) => assert_eq!(after, Some(set)),
            None => assert_eq!(after.as_deref(), Some("0".as_ref())),
        }
    }
}
