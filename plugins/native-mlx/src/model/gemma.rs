//! Gemma 3's own pieces: its norms of weight `1 + w`, the scaled embedding, the GELU of its MLP, the clipped residual and the soft-capped logits, as mlx-lm's `gemma3_text` computes them.

use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::ops::{clip, tanh};
use mlx_rs::transforms::compile::compile;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype, Stream};

use crate::error::Result;

/// The weight Gemma's `RMSNorm` passes to the kernel: `1.0 + w`, in `w`'s
/// type as Python's scalar arithmetic leaves it. mlx-lm adds it on every
/// call; the sum is the same each time, so it is made once.
pub(crate) fn norm_weight(w: &Array) -> Result<Array> {
    let one = Array::from_f32(1.0).as_dtype(w.dtype())?;
    let weight = one.add(w)?;
    eval([&weight])?;
    Ok(weight)
}

/// The embedding's scale, `sqrt(hidden)` rounded to bfloat16 as mlx-lm
/// writes it (`mx.array(hidden ** 0.5, mx.bfloat16)`), cast to the
/// embedding's type at use.
pub(crate) fn embed_scale(hidden: i32) -> Result<Array> {
    let scale = Array::from_f32((hidden as f64).sqrt() as f32).as_dtype(Dtype::Bfloat16)?;
    eval([&scale])?;
    Ok(scale)
}

/// `h * scale`, the embedding scaled as mlx-lm scales it.
pub(crate) fn scale_embedding(h: &Array, scale: &Array) -> Result<Array> {
    Ok(h.multiply(scale.as_dtype(h.dtype())?)?)
}

/// mlx-lm's `clip_residual`: `x + y`, but in float16 summed in float32 and
/// clipped to float16's range (Gemma's activations outgrow it).
pub(crate) fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(x.add(y)?);
    }
    let bound = 65504.0_f32;
    let sum = x
        .as_dtype(Dtype::Float32)?
        .add(y.as_dtype(Dtype::Float32)?)?;
    Ok(clip(&sum, (-bound, bound))?.as_dtype(Dtype::Float16)?)
}

/// `cap * tanh(logits / cap)`: the final soft-capping of a config that
/// declares `final_logit_softcapping` (transformers' Gemma applies it;
/// mlx-lm 0.32's `gemma3_text` does not read it).
pub(crate) fn soft_cap(logits: &Array, cap: f32) -> Result<Array> {
    let cap = Array::from_f32(cap).as_dtype(logits.dtype())?;
    Ok(tanh(logits.divide(&cap)?)?.multiply(&cap)?)
}

/// A compiled function of one array.
type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> mlx_rs::error::Result<Array>>;

thread_local! {
    /// `gelu_approx`, compiled once per stream of this thread and input
    /// type (its constants are of the input's type), as `swiglu` is.
    static GELU_APPROX: RefCell<HashMap<(i32, Dtype), Compiled1>> = RefCell::new(HashMap::new());
}

/// `mlx.nn.gelu_approx`, compiled (shapeless) as mlx.nn compiles it, with
/// its ops in its order and its Python constants in `x`'s type:
/// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`. The CPU
/// build fuses it into one generated kernel, so the same graph is what
/// gives the same bits.
pub(crate) fn gelu_approx(x: &Array) -> Result<Array> {
    let stream = Stream::thread_local_or_default().get_index()?;
    let dtype = x.dtype();
    GELU_APPROX.with_borrow_mut(|compiled| {
        let f = match compiled.entry((stream, dtype)) {
            std::collections::hash_map::Entry::Occupied(f) => f.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let constant = |v: f64| -> Result<Array> {
                    let c = Array::from_f32(v as f32).as_dtype(dtype)?;
                    eval([&c])?;
                    Ok(c)
                };
                let half = constant(0.5)?;
                let one = constant(1.0)?;
                let three = constant(3.0)?;
                let cubic = constant(0.044715)?;
                let root = constant((2.0 / std::f64::consts::PI).sqrt())?;
                let f = move |x: &Array| -> mlx_rs::error::Result<Array> {
                    let inner = x.add(cubic.multiply(x.power(&three)?)?)?;
                    let t = tanh(root.multiply(&inner)?)?;
                    half.multiply(x)?.multiply(one.add(&t)?)
                };
                slot.insert(Box::new(compile(f, true)))
            }
        };
        Ok(f(x)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_cap_bounds_logits_by_tanh() {
        let logits = Array::from_slice(&[-100.0f32, -3.0, 0.0, 2.5, 1000.0], &[5]);
        let capped = soft_cap(&logits, 30.0).unwrap();
        capped.eval().unwrap();
        for (&got, x) in capped
            .as_slice::<f32>()
            .iter()
            .zip([-100.0f64, -3.0, 0.0, 2.5, 1000.0])
        {
            let want = 30.0 * (x / 30.0).tanh();
            assert!(
                (got as f64 - want).abs() < 1e-5,
                "{x}: {got} against {want}"
            );
        }
    }

    #[test]
    fn norm_weights_and_embedding_scale_are_as_mlx_lm_makes_them() {
        let w = Array::from_slice(&[-0.5f32, 0.0, 0.25], &[3])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let weight = norm_weight(&w).unwrap();
        assert_eq!(weight.dtype(), Dtype::Bfloat16);
        let weight = weight.as_dtype(Dtype::Float32).unwrap();
        weight.eval().unwrap();
        assert_eq!(weight.as_slice::<f32>(), [0.5, 1.0, 1.25]);
        // sqrt(128) = 11.3137... is 11.3125 in bfloat16, as mlx-lm rounds it.
        let scale = embed_scale(128).unwrap().as_dtype(Dtype::Float32).unwrap();
        scale.eval().unwrap();
        assert_eq!(scale.as_slice::<f32>(), [11.3125]);
    }

    #[test]
    fn residual_clips_float16_to_its_range() {
        let x = Array::from_slice(&[60000.0f32, -60000.0, 1.0], &[3])
            .as_dtype(Dtype::Float16)
            .unwrap();
        let sum = residual(&x, &x).unwrap();
        assert_eq!(sum.dtype(), Dtype::Float16);
        let sum = sum.as_dtype(Dtype::Float32).unwrap();
        sum.eval().unwrap();
        assert_eq!(sum.as_slice::<f32>(), [65504.0, -65504.0, 2.0]);
    }
}
