"""Lets the pinned mlx-lm run quantized mixtures of experts on the pinned MLX.

mlx-lm 0.32.2's `QuantizedSwitchLinear` passes `global_scale=` to
`mx.gather_qmm` (`None` but for nvfp4 experts with a tensor scale), which
MLX 0.32.2's `gather_qmm` does not take: every quantized
mixture-of-experts model failed with a TypeError there. A `None` scale
means no scale, so it is dropped; any other is refused. Importing this
module applies it (the bench's mlx-lm scripts and the engine tests'
reference, tests/mlx_lm_reference.py).
"""
import mlx.core as mx


def allow_gather_qmm_without_global_scale():
    if "global_scale" in (mx.gather_qmm.__doc__ or ""):
        return
    gather_qmm = mx.gather_qmm

    def without_global_scale(*args, global_scale=None, **kwargs):
        if global_scale is not None:
            raise ValueError("this MLX's gather_qmm takes no global_scale")
        return gather_qmm(*args, **kwargs)

    mx.gather_qmm = without_global_scale


allow_gather_qmm_without_global_scale()
