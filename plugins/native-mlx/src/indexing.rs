//! Array indexing on the stream that `with_stream` selects, like every other op the engine uses.
//!
//! mlx-rs 0.33's `try_index` and `try_index_mut` ignore `with_stream`: they
//! always build on the calling thread's default stream. A session builds its
//! graphs on a stream of its own, so through them the KV cache updates, the
//! cache slices and the last-token logits would land on a second stream, and
//! every layer would cross streams twice per step. MLX orders such crossings
//! with events; on CUDA each one also commits the pending command buffer and
//! queues a kernel that waits for the other stream, so a decoding step broke
//! into dozens of small submissions, and once more than MLX's limit of tasks
//! were in flight `async_eval` itself waited for the GPU (no overlap of graph
//! building and execution). `clippy.toml` forbids the two methods in this
//! crate; use [`IndexOnStream`] instead.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Stream};

use crate::error::Result;

/// `try_index` on the current thread-local stream. Updates go through
/// [`crate::ffi::slice_update`], which takes the same stream.
pub(crate) trait IndexOnStream {
    /// `self[index]`, as a lazy view.
    fn at<I>(&self, index: I) -> Result<Array>
    where
        Array: TryIndexOp<I>;
}

impl IndexOnStream for Array {
    fn at<I>(&self, index: I) -> Result<Array>
    where
        Array: TryIndexOp<I>,
    {
        let stream = Stream::thread_local_or_default();
        Ok(self.try_index_device(index, stream)?)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::{with_stream, Array};

    use super::IndexOnStream;
    use crate::ffi::{slice_update, SendStream};

    /// Regression: mlx-rs's own `try_index` / `try_index_mut` built on the
    /// calling thread's default stream inside `with_stream` (updates now go
    /// through `slice_update`, checked here alike). Streams of a
    /// thread only evaluate on that thread, so a graph that leaked onto one
    /// fails to evaluate elsewhere; a session's graph must not.
    #[test]
    fn index_ops_run_on_the_scoped_stream() {
        let session = SendStream::new(false).unwrap();
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
        let (slice, updated) = with_stream(&session.0, || {
            let slice = a.at(1..).unwrap();
            let updated =
                slice_update(&a, &Array::from_slice(&[9.0f32], &[1]), &[0], &[1]).unwrap();
            (slice, updated)
        });
        let values = std::thread::spawn(move || {
            let session = session; // the whole SendStream, not its !Send field
            with_stream(&session.0, || {
                mlx_rs::transforms::eval([&slice, &updated]).unwrap();
                (
                    slice.as_slice::<f32>().to_vec(),
                    updated.as_slice::<f32>().to_vec(),
                )
            })
        })
        .join()
        .unwrap();
        assert_eq!(values, (vec![2.0, 3.0], vec![9.0, 2.0, 3.0]));
    }
}
