#!/usr/bin/env python3
"""Converts a Llama-architecture GGUF file into an MLX model folder, losslessly.

mlx-lm does not read GGUF; this does, for the GGUF files the project serves
(`scripts/real-model.sh` converts SmolLM2-135M-Instruct.Q4_1 with it):

    $(scripts/python-env.sh) scripts/gguf_to_mlx.py MODEL.gguf OUT_DIR [--dtype quantized|float32|float16]

It writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json
(the chat template and special tokens from the GGUF metadata) and
generation_config.json.

With `--dtype quantized` (the default) the weights keep their quantization,
because the GGUF block formats it takes are MLX's affine quantization with a
group of 32 in another packing:
  Q4_1  w = d*q + m, q in 0..15     ->  4 bits, scales = d, biases = m
  Q4_0  w = d*(q - 8)               ->  4 bits, scales = d, biases = -8d
  Q8_0  w = d*q, q in -128..127     ->  8 bits, scales = d, biases = -128d,
                                        stored q + 128
  F32/F16                            ->  float16
d and m are float16 in GGUF and stay float16 (the checkpoint's dtype), so
every weight an MLX engine reconstructs is the weight llama.cpp
reconstructs: the two engines differ in their kernels, never in the model.
(Dequantizing to float16 instead would make the folder four times larger
and round d*q + m a second time.) A file mixing widths gets per-layer
entries in config.json's `quantization`, which mlx-lm and native-mlx read.

`--dtype float32` dequantizes instead, as llama.cpp does (gguf's reference
dequantization, in float32): also lossless, four times the size, and the
fast choice on MLX's CPU backend, whose quantized matrix products are far
slower than its float32 ones (SmolLM2-135M on this project's 2-core test
machine: 8.9 s a token 4-bit, 1.1 s float16, 0.36 s float32). It takes
every type gguf can dequantize, K-quants too. `--dtype float16` rounds
each weight once more, to half the size of float32.

llama.cpp's converter permutes the rows of q_proj and k_proj (GGML's
rotary embedding pairs neighbouring dimensions, Hugging Face's halves);
this undoes it, so the folder is a plain Hugging Face-layout Llama and
every engine runs it with its default (non-traditional) rotary embedding.
Whole rows move, so quantized rows move with their scales unchanged.

What it cannot convert it refuses before writing anything, naming the
architecture, the tensor and its type, or the tokenizer: K-quants and
i-quants kept quantized (their super-blocks have no MLX equivalent),
architectures other than llama, SentencePiece vocabularies, unknown
pre-tokenizers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

GROUP = 32
CONVERTIBLE = (Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q8_0)
# What gguf's reference dequantization (gguf.quants) reads.
DEQUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K,
                 Q.Q6_K)


class ConversionError(Exception):
    """A GGUF file this converter cannot turn into an MLX folder."""


# GGUF tensor name (after `blk.N.`) -> Hugging Face module name.
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Pre-tokenizers (`tokenizer.ggml.pre`) whose split rules are known here,
# written as the Hugging Face `tokenizers` pipeline that splits the same way
# as llama.cpp's regexes for them (llama-vocab.cpp).
PRE_TOKENIZERS = {
    # \p{N} alone, then GPT-2's rule: digits one by one (SmolLM, SmolLM2).
    "smollm": [{"type": "Digits", "individual_digits": True}],
    "gpt-2": [],
    "default": [],
}


def field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ConversionError(f"the GGUF metadata has no '{key}'")
        return default
    return f.contents()


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{suffix}"
    raise ConversionError(f"tensor '{gguf_name}' has no place in a Llama model (it is not converted)")


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Packs values of `bits` bits (last axis) into uint32 words, first value lowest, as MLX does."""
    per_word = 32 // bits
    q = q.reshape(*q.shape[:-1], -1, per_word).astype(np.uint32)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits).astype(np.uint32)
    return np.bitwise_or.reduce(q << shifts, axis=-1)


def blocks(data: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """The raw bytes of a quantized tensor as (rows, blocks per row, block bytes)."""
    return np.ascontiguousarray(data).reshape(rows, -1, block_bytes)


def half(raw: np.ndarray) -> np.ndarray:
    """Two bytes per value (last axis) read as little-endian float16."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0]


def quantized(tensor) -> tuple[dict[str, np.ndarray], int] | None:
    """MLX `weight`/`scales`/`biases` of a GGUF block-quantized tensor and its width, or None if float."""
    kind = tensor.tensor_type
    cols, rows = int(tensor.shape[0]), int(np.prod(tensor.shape[1:]))
    if kind == Q.Q4_1:
        b = blocks(tensor.data, rows, 20)
        d, m, qs = half(b[..., 0:2]), half(b[..., 2:4]), b[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        return {"weight": pack(q, 4).reshape(rows, -1), "scales": d, "biases": m}, 4
    if kind == Q.Q4_0:
        b = blocks(tensor.data, rows, 18)
        d, qs = half(b[..., 0:2]), b[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        return {"weight": pack(q, 4).reshape(rows, -1), "scales": d, "biases": d * np.float16(-8)}, 4
    if kind == Q.Q8_0:
        b = blocks(tensor.data, rows, 34)
        d = half(b[..., 0:2])
        q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return {"weight": pack(q, 8).reshape(rows, -1), "scales": d, "biases": d * np.float16(-128)}, 8
    if kind in (Q.F32, Q.F16):
        return None
    raise ConversionError(
        f"tensor '{tensor.name}' is {kind.name}, which has no lossless MLX form "
        "(this converter takes F32, F16, Q4_0, Q4_1 and Q8_0: requantize the GGUF to one of them)"
    )


def unpermute(array: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's row permutation of q_proj/k_proj (`LlamaModel.permute` in convert_hf_to_gguf.py)."""
    rows = array.shape[0]
    return array.reshape(heads, rows // heads // 2, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


def convert_weights(reader: GGUFReader, n_head: int, n_head_kv: int, dtype: str):
    weights: dict[str, np.ndarray] = {}
    widths: dict[str, int] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        module = name.rpartition(".")[0]
        shape = [int(n) for n in reversed(tensor.shape)]
        parts = quantized(tensor) if dtype == "quantized" else None
        if parts is None:
            if tensor.tensor_type in (Q.F32, Q.F16):
                array = np.asarray(tensor.data)
            else:
                array = dequantize(tensor.data, tensor.tensor_type)
            float_type = np.float32 if dtype == "float32" else np.float16
            parts = {"weight": array.reshape(shape).astype(float_type)}
        else:
            parts, bits = parts
            widths[module] = bits
        heads = {"self_attn.q_proj": n_head, "self_attn.k_proj": n_head_kv}.get(module.split(".", 3)[-1])
        for key, array in parts.items():
            if heads is not None:
                array = unpermute(array, heads)
            weights[f"{module}.{key}"] = np.ascontiguousarray(array)
    return weights, widths


def quantization_block(widths: dict[str, int]) -> dict | None:
    """config.json's `quantization`: the commonest width as default, the others per module."""
    if not widths:
        return None
    default = Counter(widths.values()).most_common(1)[0][0]
    block = {"group_size": GROUP, "bits": default, "mode": "affine"}
    for module, bits in sorted(widths.items()):
        if bits != default:
            block[module] = {"group_size": GROUP, "bits": bits}
    return block


def short_float(value: float) -> float:
    """A float32 from the metadata as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def build_config(reader: GGUFReader, has_output: bool, quantization: dict | None, dtype: str) -> dict:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ConversionError(f"architecture '{arch}' is not supported (this converter takes llama)")
    if "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise ConversionError("tensor 'rope_freqs.weight' (Llama 3 rotary scaling) is not supported")
    hidden = int(field(reader, "llama.embedding_length"))
    n_head = int(field(reader, "llama.attention.head_count"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv", n_head)),
        "head_dim": int(field(reader, "llama.rope.dimension_count", hidden // n_head)),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": short_float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": short_float(field(reader, "llama.rope.freq_base", 10000.0)),
        "vocab_size": len(field(reader, "tokenizer.ggml.tokens")),
        "tie_word_embeddings": not has_output,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32" if dtype == "float32" else "float16",
    }
    if quantization:
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    return config


def build_tokenizer(reader: GGUFReader) -> tuple[dict, dict]:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary, merges and template."""
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ConversionError(f"tokenizer model '{model}' is not supported (this converter takes byte-level BPE, 'gpt2')")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConversionError(
            f"pre-tokenizer '{pre}' is not supported (known: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [
        # GGUF token types: 3 control (special), 4 user-defined (added, not special).
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] == 3}
        for i, t in enumerate(tokens) if types[i] in (3, 4)
    ]
    ids = {name: int(field(reader, f"tokenizer.ggml.{name}_token_id", -1))
           for name in ("bos", "eos", "unknown", "padding")}
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    if add_bos:
        bos = tokens[ids["bos"]]
        post = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 0}}],
                "special_tokens": {bos: {"id": bos, "ids": [ids["bos"]], "tokens": [bos]}}}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": PRE_TOKENIZERS[pre] + [byte_level]},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    special = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field(reader, "llama.context_length")),
    }
    for key, name in special.items():
        if 0 <= ids[name] < len(tokens):
            tokenizer_config[key] = tokens[ids[name]]
    template = field(reader, "tokenizer.chat_template", "")
    if template:
        tokenizer_config["chat_template"] = template
    return tokenizer, tokenizer_config


DTYPES = ("quantized", "float32", "float16")


def convert(gguf_path: Path, out_dir: Path, dtype: str = "quantized") -> dict:
    """Writes the MLX folder; returns its config. Nothing is written when the file is refused."""
    from safetensors.numpy import save_file

    reader = GGUFReader(gguf_path)
    names = {t.name for t in reader.tensors}
    # Everything that can refuse the file runs before the weights are read
    # and before anything is written.
    if dtype not in DTYPES:
        raise ConversionError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    build_config(reader, "output.weight" in names, None, dtype)
    for tensor in reader.tensors:
        hf_name(tensor.name)
        if dtype == "quantized" and tensor.tensor_type not in CONVERTIBLE:
            quantized(tensor)
        elif tensor.tensor_type not in DEQUANTIZABLE:
            raise ConversionError(f"tensor '{tensor.name}' is {tensor.tensor_type.name}, which gguf cannot dequantize")
    tokenizer, tokenizer_config = build_tokenizer(reader)
    n_head = int(field(reader, "llama.attention.head_count"))
    n_head_kv = int(field(reader, "llama.attention.head_count_kv", n_head))
    weights, widths = convert_weights(reader, n_head, n_head_kv, dtype)
    config = build_config(reader, "output.weight" in names, quantization_block(widths), dtype)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "mlx"})
        write_json(staging / "config.json", config)
        write_json(staging / "tokenizer.json", tokenizer)
        write_json(staging / "tokenizer_config.json", tokenizer_config)
        write_json(staging / "generation_config.json",
                   {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
        # mkdtemp made the folder private; a model folder is shared like any other.
        for path in staging.iterdir():
            path.chmod(0o644)
        staging.chmod(0o755)
        # The catalog must never see a half-written folder: it appears whole.
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return config


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path, help="the GGUF file")
    parser.add_argument("out_dir", type=Path, help="the MLX model folder to write (replaced if it exists)")
    parser.add_argument("--dtype", choices=DTYPES, default="quantized",
                        help="keep the GGUF quantization (default), or dequantize to float32 or float16")
    args = parser.parse_args()
    try:
        config = convert(args.gguf, args.out_dir, args.dtype)
    except ConversionError as e:
        print(f"gguf_to_mlx: cannot convert {args.gguf}: {e}", file=sys.stderr)
        return 1
    q = config.get("quantization")
    print(f"gguf_to_mlx: wrote {args.out_dir} ({config['num_hidden_layers']} layers, "
          f"{'%d-bit, group %d' % (q['bits'], q['group_size']) if q else config['torch_dtype']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
