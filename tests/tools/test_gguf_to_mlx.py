"""scripts/gguf_to_mlx.py: a GGUF file becomes the same model as an MLX folder.

Each test writes a small Llama GGUF with gguf's own writer and quantizers
(the package llama.cpp's converter uses), converts it, and reads the folder
back with MLX: every weight MLX reconstructs must be, to the bit, the weight
llama.cpp's format holds, in Hugging Face's row order. Files the converter
cannot take are refused with the tensor, type, architecture or tokenizer
named, and nothing is written.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, pre_tokenizers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import gguf_to_mlx  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def byte_level_vocab():
    """A byte-level BPE vocabulary: specials, the 256 byte symbols, a few merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "l l", "he ll"]
    tokens = SPECIALS + alphabet + ["Ġt", "he", "Ġthe", "ll", "hell"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, merges


def hf_weights(rng):
    """Hugging Face-layout float weights of the tiny model (rows are outputs)."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    tokens, _, _ = byte_level_vocab()
    weights = {"token_embd": w(len(tokens), HIDDEN), "output_norm": 1 + w(HIDDEN)}
    for i in range(LAYERS):
        weights.update({
            f"blk.{i}.attn_norm": 1 + w(HIDDEN), f"blk.{i}.ffn_norm": 1 + w(HIDDEN),
            f"blk.{i}.attn_q": w(HIDDEN, HIDDEN), f"blk.{i}.attn_k": w(KV_HEADS * HEAD_DIM, HIDDEN),
            f"blk.{i}.attn_v": w(KV_HEADS * HEAD_DIM, HIDDEN), f"blk.{i}.attn_output": w(HIDDEN, HIDDEN),
            f"blk.{i}.ffn_gate": w(FFN, HIDDEN), f"blk.{i}.ffn_up": w(FFN, HIDDEN),
            f"blk.{i}.ffn_down": w(HIDDEN, FFN),
        })
    return weights


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp applies it to q and k."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def write_gguf(path: Path, weights: dict, kinds: dict, arch="llama", tokenizer_model="gpt2", pre="smollm",
               extra_tensors=()):
    tokens, types, merges = byte_level_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    for name, array in list(weights.items()) + list(extra_tensors):
        if name.endswith("attn_q"):
            array = llama_cpp_permute(array, HEADS)
        elif name.endswith("attn_k"):
            array = llama_cpp_permute(array, KV_HEADS)
        kind = kinds.get(name.split(".")[-1], Q.F32) if array.ndim == 2 else Q.F32
        if kind in (Q.F32, Q.F16):
            w.add_tensor(f"{name}.weight", array.astype(np.float16 if kind == Q.F16 else np.float32))
        elif kind in (Q.Q6_K, Q.IQ4_NL):
            # gguf cannot quantize to these; the converter refuses them (or
            # dequantizes zeros), so any bytes of the right size do.
            block, size = gguf.GGML_QUANT_SIZES[kind]
            w.add_tensor(f"{name}.weight", np.zeros((array.shape[0], array.shape[1] // block * size), np.uint8),
                         raw_dtype=kind)
        else:
            w.add_tensor(f"{name}.weight", gguf.quants.quantize(array, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected(array: np.ndarray, kind) -> np.ndarray:
    """What llama.cpp reconstructs from `array` stored as `kind`, in float32."""
    if kind == Q.F32:
        return array.astype(np.float16).astype(np.float32)  # the folder is float16
    if kind == Q.F16:
        return array.astype(np.float16).astype(np.float32)
    return gguf.quants.dequantize(gguf.quants.quantize(array, kind), kind).reshape(array.shape)


def reconstructed(folder: dict, module: str, config: dict) -> np.ndarray:
    """The weight an MLX engine rebuilds for `module`, in float32 (scales not rounded again)."""
    weight = folder[f"{module}.weight"]
    if f"{module}.scales" not in folder:
        return np.array(weight.astype(mx.float32))
    params = config["quantization"].get(module, config["quantization"])
    return np.array(mx.dequantize(weight, folder[f"{module}.scales"].astype(mx.float32),
                                  folder[f"{module}.biases"].astype(mx.float32),
                                  group_size=params["group_size"], bits=params["bits"]))


@pytest.mark.parametrize("kinds", [
    {"attn_q": Q.Q4_1, "attn_k": Q.Q4_1, "attn_v": Q.Q4_1, "attn_output": Q.Q4_1, "ffn_gate": Q.Q4_1,
     "ffn_up": Q.Q4_1, "ffn_down": Q.Q4_1, "token_embd": Q.Q8_0},
    {"attn_q": Q.Q4_0, "attn_k": Q.Q8_0, "attn_v": Q.F16, "attn_output": Q.Q4_0, "ffn_gate": Q.Q4_1,
     "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0, "token_embd": Q.F32},
], ids=["smollm2-like", "mixed"])
@pytest.mark.parametrize("dtype", ["quantized", "float32"])
def test_every_weight_is_the_one_llama_cpp_holds(tmp_path, kinds, dtype):
    weights = hf_weights(np.random.default_rng(0))
    write_gguf(tmp_path / "m.gguf", weights, kinds)
    config = gguf_to_mlx.convert(tmp_path / "m.gguf", tmp_path / "m", dtype)
    folder = mx.load(str(tmp_path / "m" / "model.safetensors"))
    assert config["tie_word_embeddings"] is True and config["num_key_value_heads"] == KV_HEADS
    for name, array in weights.items():
        module = gguf_to_mlx.hf_name(f"{name}.weight").rpartition(".")[0]
        kind = kinds.get(name.split(".")[-1], Q.F32) if array.ndim == 2 else Q.F32
        want = expected(array, kind)
        if dtype == "float32" and kind == Q.F32:
            want = array  # nothing is rounded
        got = reconstructed(folder, module, config)
        assert got.shape == want.shape, module
        np.testing.assert_array_equal(got, want, err_msg=f"{module} ({kind.name})")
        allowed = (mx.float32,) if dtype == "float32" else (mx.float16, mx.uint32)
        assert folder[f"{module}.weight"].dtype in allowed, module
        if dtype == "quantized" and kind in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
            # Per-layer widths: 4 bits is the commonest (the default), 8-bit layers are named.
            bits = config["quantization"].get(module, config["quantization"])["bits"]
            assert bits == (8 if kind == Q.Q8_0 else 4), module
    if dtype == "quantized":
        assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    else:
        assert "quantization" not in config and config["torch_dtype"] == "float32"


def test_the_tokenizer_and_template_come_from_the_metadata(tmp_path):
    weights = hf_weights(np.random.default_rng(1))
    write_gguf(tmp_path / "m.gguf", weights, {"token_embd": Q.Q8_0})
    gguf_to_mlx.convert(tmp_path / "m.gguf", tmp_path / "m")
    tok = Tokenizer.from_file(str(tmp_path / "m" / "tokenizer.json"))
    tokens, _, _ = byte_level_vocab()
    assert tok.get_vocab_size() == len(tokens)
    # Specials stay whole; digits split one by one (the smollm pre-tokenizer);
    # merges apply; decoding gives the text back.
    text = "<|im_start|>so the hello 42<|im_end|>"
    ids = tok.encode(text).ids
    pieces = [tokens[i] for i in ids]
    assert pieces[0] == "<|im_start|>" and pieces[-1] == "<|im_end|>"
    assert "Ġthe" in pieces and "hell" in pieces
    assert pieces[-3:-1] == ["4", "2"] or pieces[-4:-1] == ["Ġ", "4", "2"]
    assert tok.decode(ids, skip_special_tokens=False) == text
    config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == TEMPLATE
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert json.loads((tmp_path / "m" / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.mark.parametrize("change, message", [
    (dict(kinds={"ffn_down": Q.Q6_K}), "tensor 'blk.0.ffn_down.weight' is Q6_K, which has no lossless MLX form"),
    (dict(kinds={"ffn_down": Q.IQ4_NL}, dtype="float32"),
     "tensor 'blk.0.ffn_down.weight' is IQ4_NL, which gguf cannot dequantize"),
    (dict(arch="gpt2"), "architecture 'gpt2' is not supported (this converter takes llama)"),
    (dict(tokenizer_model="llama"), "tokenizer model 'llama' is not supported"),
    (dict(pre="qwen2"), "pre-tokenizer 'qwen2' is not supported"),
    (dict(extra_tensors=[("rope_freqs", np.ones(HEAD_DIM // 2, dtype=np.float32))]),
     "tensor 'rope_freqs.weight' (Llama 3 rotary scaling) is not supported"),
])
def test_a_file_it_cannot_convert_is_refused_by_name_and_nothing_is_written(tmp_path, change, message):
    weights = hf_weights(np.random.default_rng(2))
    kinds = change.pop("kinds", {})
    dtype = change.pop("dtype", "quantized")
    if Q.Q6_K in kinds.values():
        # Q6_K's super-blocks span 256 weights.
        for i in range(LAYERS):
            weights[f"blk.{i}.ffn_down"] = np.random.default_rng(3).standard_normal((HIDDEN, 256)).astype(np.float32)
    write_gguf(tmp_path / "m.gguf", weights, kinds, **change)
    with pytest.raises(gguf_to_mlx.ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gguf_to_mlx.convert(tmp_path / "m.gguf", tmp_path / "m", dtype)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_k_quants_are_dequantized_when_asked_for_floats(tmp_path):
    weights = hf_weights(np.random.default_rng(4))
    for i in range(LAYERS):
        weights[f"blk.{i}.ffn_down"] = np.random.default_rng(5).standard_normal((HIDDEN, 256)).astype(np.float32)
    write_gguf(tmp_path / "m.gguf", weights, {"ffn_down": Q.Q6_K})
    gguf_to_mlx.convert(tmp_path / "m.gguf", tmp_path / "m", "float32")
    folder = mx.load(str(tmp_path / "m" / "model.safetensors"))
    # The test writes Q6_K blocks of zeros (gguf cannot quantize to it).
    assert folder["model.layers.0.mlp.down_proj.weight"].shape == (HIDDEN, 256)
