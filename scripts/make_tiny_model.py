#!/usr/bin/env python3
"""Writes a tiny random-weight Hugging Face-style model folder for tests.

Output (deterministic for a given --seed and shape): config.json,
model.safetensors, tokenizer.json (byte-level BPE trained locally),
tokenizer_config.json (ChatML template) and generation_config.json.
It loads in mlx_lm.generate / mlx_lm.server; its text output is garbage.
Families: llama, qwen2, qwen3, mistral; phi3 (fused qkv_proj and
gate_up_proj, partial rotary embeddings, LongRoPE scaling); gemma3_text
(sliding-window layers of --window positions every other layer, Gemma's
norms, tied embeddings) and gemma3 (the same text model inside a
vision-language folder: `text_config`, weights under `language_model.`, and
a few vision tensors the text path ignores; with --vision a whole tiny SigLIP
vision tower and multi-modal projector instead, as mlx-vlm's `gemma3` loads
them); mimo (Xiaomi MiMo: qwen2 plus --mtp-layers multi-token-prediction
layers under model.mtp_layers.{i}, as MiMo-7B's checkpoints store them; with
--mtp-from-main a one-layer model whose MTP layer is derived from it, see
derive_mtp_from_main).
Run it with the venv from scripts/python-env.sh:
    $(scripts/python-env.sh) scripts/make_tiny_model.py /tmp/tiny --arch qwen3
"""
import argparse
import json
import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# gemma3 --vision: the special tokens of Gemma 3's processor and chat
# template, after the others (so the other ids stay as they are), and a
# padding token of its own (mlx-vlm zeroes the embedding of the padding id
# in prompts with images; Gemma 3's is never in a prompt).
GEMMA3_VISION_TOKENS = ["<pad>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
                        "<start_of_turn>", "<end_of_turn>"]

# Gemma 3's own chat template (google/gemma-3-4b-it): content given as a
# string, or as parts of which an image becomes <start_of_image>, which the
# processor expands into the image's soft tokens.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model does not need to be
clever; it needs to load, to run, and to stop when it is told. Hello, world!
Hello there, how are you today? I am fine, thank you, and how are you?

Local inference engines read a folder of weights, a tokenizer and a config.
They turn a prompt into tokens, run the network one step at a time, and turn
the tokens back into text. Tests check the number of tokens, the finish reason
and the shape of every answer, because random weights only produce noise.

Once upon a time there was a little hangar at the edge of a quiet airfield.
Every morning the pilots opened its doors, checked the engines, and wrote the
numbers 0 1 2 3 4 5 6 7 8 9 into their logbooks before they flew away.
Questions, answers, lists: one, two, three; red, green, blue; (a) [b] {c}.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(vocab_size, specials=(), plain_fill=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 20, trainer=trainer)
    # The corpus yields ~560 tokens; fill larger vocabularies with reserved
    # specials, or (benchmark folders) with plain words: a random model
    # mostly picks filler, and a special is left out of the text, so its
    # answers would stream nothing to time.
    got = tok.get_vocab_size()
    if plain_fill:
        # Words of the BPE model's own vocabulary (no merge makes them, so
        # no prompt encodes to them): as many added tokens take the Rust
        # tokenizers crate 20 s to load (its Aho-Corasick automaton).
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        for i in range(vocab_size - got):
            vocab[f"\u0120w{i}"] = got + i
        tok = Tokenizer.from_str(json.dumps(data))
    else:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(vocab_size - got)])
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


# qwen3_moe: the layers that keep a dense MLP (the others are sparse, as
# `decoder_sparse_step` 1 makes every layer but these).
MLP_ONLY_LAYERS = [1]


class TiledRng:
    """A stand-in for numpy's generator whose large draws repeat one block
    of random values: drawing 7.6 billion normal values takes minutes, and a
    benchmark's random weights need only be random-looking. The block's
    length is prime, so no two rows of a matrix are the same."""

    BLOCK = 16_777_259

    def __init__(self, rng):
        self.rng = rng
        self.block = rng.standard_normal(self.BLOCK, dtype=np.float32)

    def normal(self, loc, scale, size):
        n = int(np.prod(size))
        if n <= self.BLOCK:
            return self.rng.normal(loc, scale, size=size)
        out = np.resize(self.block, n).reshape(size)
        out *= np.float32(scale)
        out += np.float32(loc)
        return out

    def __getattr__(self, name):
        return getattr(self.rng, name)


def mlx_lm_weights(out_dir, config, a):
    """Random weights at `config`'s sizes through mlx-lm's own model class,
    quantized to `a.bits` as `mlx_lm.convert` quantizes (its layout, its
    predicate) and written by mlx-lm's `save_model`, with `config.json`
    rewritten by `save_config`. MLX computes lazily: each tensor is drawn,
    cast and quantized when its shard is written, so nothing near the
    unquantized model's size is held."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    mx.random.seed(a.seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    dtype = getattr(mx, a.dtype)

    def draw(w):
        if not mx.issubdtype(w.dtype, mx.floating):
            return w
        if w.ndim >= 2:  # matrices and stacked experts, as make_weights draws them
            return (mx.random.normal(w.shape) * 0.02).astype(dtype)
        return w.astype(dtype)

    model.update(tree_map(draw, model.parameters()))
    model, config = quantize_model(model, dict(config), a.group_size, a.bits)
    save_model(out_dir, model)
    save_config(config, os.path.join(out_dir, "config.json"))


def make_weights(a, head_dim, rng):
    h, inter = a.hidden, a.intermediate
    q_out, kv_out = a.heads * head_dim, a.kv_heads * head_dim
    rand = lambda *shape: rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    ones = lambda n: np.ones(n, dtype=np.float32)
    if a.arch in ("gemma3_text", "gemma3"):
        return make_gemma3_weights(a, head_dim, rng)
    w = {"model.embed_tokens.weight": rand(a.vocab, h)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        if a.arch == "phi3":  # fused, as Phi-3 checkpoints store them
            w[p + "self_attn.qkv_proj.weight"] = rand(q_out + 2 * kv_out, h)
            w[p + "self_attn.o_proj.weight"] = rand(h, q_out)
            w[p + "mlp.gate_up_proj.weight"] = rand(2 * inter, h)
            w[p + "mlp.down_proj.weight"] = rand(h, inter)
            w[p + "input_layernorm.weight"] = ones(h)
            w[p + "post_attention_layernorm.weight"] = ones(h)
            continue
        w[p + "self_attn.q_proj.weight"] = rand(q_out, h)
        w[p + "self_attn.k_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.v_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, q_out)
        if a.arch in ("qwen2", "gpt_oss", "mimo"):
            w[p + "self_attn.q_proj.bias"] = rand(q_out)
            w[p + "self_attn.k_proj.bias"] = rand(kv_out)
            w[p + "self_attn.v_proj.bias"] = rand(kv_out)
        if a.arch in ("qwen3", "qwen3_moe"):
            w[p + "self_attn.q_norm.weight"] = ones(head_dim)
            w[p + "self_attn.k_norm.weight"] = ones(head_dim)
        if a.arch == "gpt_oss":
            w[p + "self_attn.o_proj.bias"] = rand(h)
            w[p + "self_attn.sinks"] = rng.normal(0.0, 1.0, size=(a.heads,)).astype(np.float32)
            w[p + "mlp.router.weight"] = rng.normal(0.0, 0.1, size=(a.experts, h)).astype(np.float32)
            w[p + "mlp.router.bias"] = rand(a.experts)
            # mlx-lm's layout (what its sanitize makes of the original
            # checkpoint): experts stacked, gate and up apart. Gate and up
            # wide enough that some activations pass the clamp at 7.
            wide = lambda *shape: rng.normal(0.0, 0.4, size=shape).astype(np.float32)
            x = p + "mlp.experts."
            w[x + "gate_proj.weight"] = wide(a.experts, inter, h)
            w[x + "gate_proj.bias"] = rand(a.experts, inter)
            w[x + "up_proj.weight"] = wide(a.experts, inter, h)
            w[x + "up_proj.bias"] = rand(a.experts, inter)
            w[x + "down_proj.weight"] = rand(a.experts, h, inter)
            w[x + "down_proj.bias"] = rand(a.experts, h)
        elif a.arch == "qwen3_moe" and i not in MLP_ONLY_LAYERS:
            # Hugging Face's layout, one tensor per expert (mlx-lm stacks
            # them at load; its converter writes them stacked). A router
            # wider than the other weights, so that routing is decisive.
            w[p + "mlp.gate.weight"] = rng.normal(0.0, 0.1, size=(a.experts, h)).astype(np.float32)
            for e in range(a.experts):
                x = f"{p}mlp.experts.{e}."
                w[x + "gate_proj.weight"] = rand(a.moe_intermediate, h)
                w[x + "up_proj.weight"] = rand(a.moe_intermediate, h)
                w[x + "down_proj.weight"] = rand(h, a.moe_intermediate)
        else:
            w[p + "mlp.gate_proj.weight"] = rand(inter, h)
            w[p + "mlp.up_proj.weight"] = rand(inter, h)
            w[p + "mlp.down_proj.weight"] = rand(h, inter)
        w[p + "input_layernorm.weight"] = ones(h)
        w[p + "post_attention_layernorm.weight"] = ones(h)
    w["model.norm.weight"] = ones(h)
    w["lm_head.weight"] = rand(a.vocab, h)
    if a.arch == "mimo":
        # MTP norm weights away from 1, so that a norm applied to the
        # wrong input (or left out) changes the numbers.
        norm = lambda n: rng.normal(1.0, 0.1, size=n).astype(np.float32)
        # The final norm too: the MTP layer reads the hidden state before
        # it, and with weights of one after it would read nearly the same.
        w["model.norm.weight"] = norm(h)
        for i in range(a.mtp_layers):
            p = f"model.mtp_layers.{i}."
            for n in ("token_layernorm", "hidden_layernorm", "input_layernorm",
                      "post_attention_layernorm", "final_layernorm"):
                w[p + n + ".weight"] = norm(h)
            w[p + "input_proj.weight"] = rand(h, 2 * h)
            w[p + "self_attn.q_proj.weight"] = rand(q_out, h)
            w[p + "self_attn.q_proj.bias"] = rand(q_out)
            w[p + "self_attn.k_proj.weight"] = rand(kv_out, h)
            w[p + "self_attn.k_proj.bias"] = rand(kv_out)
            w[p + "self_attn.v_proj.weight"] = rand(kv_out, h)
            w[p + "self_attn.v_proj.bias"] = rand(kv_out)
            w[p + "self_attn.o_proj.weight"] = rand(h, q_out)
            w[p + "mlp.gate_proj.weight"] = rand(inter, h)
            w[p + "mlp.up_proj.weight"] = rand(inter, h)
            w[p + "mlp.down_proj.weight"] = rand(h, inter)
        if a.mtp_from_main:
            derive_mtp_from_main(w, a)
    return w


def derive_mtp_from_main(w, a):
    """An MTP layer that predicts as the (one-layer) model does, one token later.

    The layer at position p reads the model's hidden state there and the
    embedding of token p + 1, and guesses token p + 2. Here `input_proj`
    passes the (normed) embedding through and ignores the hidden state; the
    embedding rows have unit RMS, so `token_layernorm` (ones) leaves them as
    they are up to its epsilon; the block is a copy of the model's only
    layer and `final_layernorm` of its final norm. The layer then computes
    the model over the tokens from the second on (the first, at position 0,
    is zeroed as vLLM does): its guesses are the model's next tokens but for
    what the first token and the epsilon change. Greedy acceptance is high
    by construction, not by training.
    """
    if a.layers != 1:
        raise SystemExit("--mtp-from-main needs --layers 1")
    h = a.hidden
    e = w["model.embed_tokens.weight"]
    w["model.embed_tokens.weight"] = e / np.sqrt(np.mean(e * e, axis=1, keepdims=True))
    for i in range(a.mtp_layers):
        p = f"model.mtp_layers.{i}."
        for name in list(w):
            if name.startswith("model.layers.0."):
                w[p + name[len("model.layers.0."):]] = w[name].copy()
        w[p + "input_proj.weight"] = np.concatenate(
            [np.zeros((h, h), np.float32), np.eye(h, dtype=np.float32)], axis=1)
        for n in ("token_layernorm", "hidden_layernorm"):
            w[p + n + ".weight"] = np.ones(h, np.float32)
        w[p + "final_layernorm.weight"] = w["model.norm.weight"].copy()


def openai_mxfp4_experts(w, layers):
    """Rewrites gpt_oss experts in the layout of OpenAI's release: each
    projection MXFP4-packed (`_blocks` of 16 bytes per 32 weights, `_scales`
    one byte per 32), gate and up as one `gate_up_proj` with their rows
    interleaved (gate, up, gate, ...), biases likewise."""
    import mlx.core as mx

    def pack(weight):
        q, scales = mx.quantize(mx.array(weight), group_size=32, bits=4, mode="mxfp4")
        blocks = q.view(mx.uint8).reshape(*q.shape[:-1], -1, 16)
        return np.array(blocks), np.array(scales)

    def interleave(gate, up):
        return np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:])

    for i in range(layers):
        x = f"model.layers.{i}.mlp.experts."
        gate, up = pack(w.pop(x + "gate_proj.weight")), pack(w.pop(x + "up_proj.weight"))
        w[x + "gate_up_proj_blocks"] = interleave(gate[0], up[0])
        w[x + "gate_up_proj_scales"] = interleave(gate[1], up[1])
        w[x + "gate_up_proj_bias"] = interleave(w.pop(x + "gate_proj.bias"), w.pop(x + "up_proj.bias"))
        w[x + "down_proj_blocks"], w[x + "down_proj_scales"] = pack(w.pop(x + "down_proj.weight"))
        w[x + "down_proj_bias"] = w.pop(x + "down_proj.bias")


def make_gemma3_weights(a, head_dim, rng):
    """Gemma 3's text model: norms of weight 1 + w (so w near 0, random to
    catch a forgotten 1), no lm_head (tied, as Gemma 3 ships)."""
    h, inter = a.hidden, a.intermediate
    q_out, kv_out = a.heads * head_dim, a.kv_heads * head_dim
    rand = lambda *shape: rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    norm = lambda n: rng.normal(0.0, 0.1, size=n).astype(np.float32)
    lm = "language_model." if a.arch == "gemma3" else ""
    w = {f"{lm}model.embed_tokens.weight": rand(a.vocab, h)}
    for i in range(a.layers):
        p = f"{lm}model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(q_out, h)
        w[p + "self_attn.k_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.v_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, q_out)
        w[p + "self_attn.q_norm.weight"] = norm(head_dim)
        w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(inter, h)
        w[p + "mlp.up_proj.weight"] = rand(inter, h)
        w[p + "mlp.down_proj.weight"] = rand(h, inter)
        for n in ("input_layernorm", "post_attention_layernorm",
                  "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            w[p + n + ".weight"] = norm(h)
    w[f"{lm}model.norm.weight"] = norm(h)
    if a.arch == "gemma3" and a.vision:
        w.update(make_vision_weights(a, h, np.random.default_rng(a.seed + 1)))
    elif a.arch == "gemma3":  # a vision tower and projector the text path ignores
        w["vision_tower.vision_model.embeddings.patch_embedding.weight"] = rand(16, 3, 4, 4)
        w["multi_modal_projector.mm_input_projection_weight"] = rand(16, h)
    return w


def make_vision_weights(a, text_hidden, rng):
    """Gemma 3's SigLIP vision tower and multi-modal projector, named as
    transformers and mlx-vlm name them; the patch kernel in PyTorch's
    (out, in, kh, kw) layout, as a Hugging Face folder holds it (mlx-vlm
    transposes it on load). LayerNorm weights near 1 and biases near 0, but
    random, so that a swapped or forgotten one shows; the projector's RMS
    norm weighs 1 + w."""
    d, inter, p = a.vision_hidden, a.vision_intermediate, a.patch_size
    patches = (a.image_size // p) ** 2
    rand = lambda *shape, s=0.05: rng.normal(0.0, s, size=shape).astype(np.float32)
    t = "vision_tower.vision_model."
    w = {
        t + "embeddings.patch_embedding.weight": rand(d, 3, p, p),
        t + "embeddings.patch_embedding.bias": rand(d),
        t + "embeddings.position_embedding.weight": rand(patches, d, s=0.5),
    }
    ln = lambda name: {name + ".weight": 1.0 + rand(d, s=0.1), name + ".bias": rand(d, s=0.1)}
    for i in range(a.vision_layers):
        l = f"{t}encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[l + f"self_attn.{n}.weight"] = rand(d, d, s=0.2)
            w[l + f"self_attn.{n}.bias"] = rand(d)
        w[l + "mlp.fc1.weight"] = rand(inter, d, s=0.2)
        w[l + "mlp.fc1.bias"] = rand(inter)
        w[l + "mlp.fc2.weight"] = rand(d, inter, s=0.2)
        w[l + "mlp.fc2.bias"] = rand(d)
        w.update(ln(l + "layer_norm1"))
        w.update(ln(l + "layer_norm2"))
    w.update(ln(t + "post_layernorm"))
    w["multi_modal_projector.mm_soft_emb_norm.weight"] = rand(d, s=0.1)
    w["multi_modal_projector.mm_input_projection_weight"] = rand(d, text_hidden, s=0.2)
    return w


def vision_config(a):
    """A tiny Gemma 3 vision_config (SigLIP), in transformers' fields."""
    return {
        "model_type": "siglip_vision_model",
        "hidden_size": a.vision_hidden,
        "intermediate_size": a.vision_intermediate,
        "num_hidden_layers": a.vision_layers,
        "num_attention_heads": a.vision_heads,
        "patch_size": a.patch_size,
        "image_size": a.image_size,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
        "vision_use_head": False,
    }


def gemma3_text_config(a, head_dim):
    """A gemma3_text config: every other layer slides over --window positions
    (sliding_window_pattern 2, and layer_types saying the same), the global
    ones with Gemma 3 4B's linear RoPE scaling; query_pre_attn_scalar not a
    power of two."""
    pattern = 2
    return {
        "model_type": "gemma3_text",
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": head_dim,
        "intermediate_size": a.intermediate,
        "vocab_size": a.vocab,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 24,
        "sliding_window": a.window,
        "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if i % pattern == pattern - 1 else "sliding_attention"
                        for i in range(a.layers)],
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }


def save_weights(weights, path, dtype):
    meta = {"format": "pt"}
    if dtype == "bfloat16":  # numpy has no bfloat16: let MLX convert and write
        import mlx.core as mx

        mx.save_safetensors(path, {k: mx.array(v).astype(mx.bfloat16) for k, v in weights.items()}, metadata=meta)
    else:
        from safetensors.numpy import save_file

        # Packed (integer) tensors keep their dtype.
        save_file({k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in weights.items()},
                  path, metadata=meta)
    os.chmod(path, 0o644)  # safetensors writes 0600


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text", "gemma3",
                                       "qwen3_moe", "gpt_oss", "mimo"],
                    default="llama")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head-dim", type=int, help="the attention heads' width (default: hidden / heads)")
    ap.add_argument("--bits", type=int, choices=[4, 8],
                    help="with --bench: random weights made by mlx-lm's own model class and quantized as "
                         "mlx_lm.convert does (affine, --group-size), never held or written unquantized: "
                         "a 30B mixture of experts fits a GPU and a disk that its bfloat16 copy would not")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--bench", action="store_true",
                    help="a benchmark folder: each large tensor repeats one random block (minutes saved at 7B), "
                         "and the vocabulary past the trained tokens is plain words, so answers stream text")
    ap.add_argument("--window", type=int, default=8, help="gemma3, gpt_oss: the sliding window")
    ap.add_argument("--experts", type=int, default=8, help="mixture-of-experts architectures")
    ap.add_argument("--mtp-layers", type=int, default=1, help="mimo: MTP layers (num_nextn_predict_layers)")
    ap.add_argument("--mtp-from-main", action="store_true",
                    help="mimo with --layers 1: MTP layers derived from the model (see derive_mtp_from_main)")
    ap.add_argument("--experts-per-tok", type=int, default=2)
    ap.add_argument("--moe-intermediate", type=int, default=128)
    ap.add_argument("--openai-mxfp4", action="store_true",
                    help="gpt_oss: the experts as OpenAI released them (MXFP4 blocks, gate and up "
                    "rows interleaved, quantization_config mxfp4)")
    ap.add_argument("--vision", action="store_true",
                    help="gemma3: a whole tiny vision tower and projector (the sizes below)")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--patch-size", type=int, default=8)
    ap.add_argument("--vision-hidden", type=int, default=64)
    ap.add_argument("--vision-intermediate", type=int, default=128)
    ap.add_argument("--vision-layers", type=int, default=2)
    ap.add_argument("--vision-heads", type=int, default=2)
    ap.add_argument("--mm-tokens", type=int, default=4, help="soft tokens per image (a square)")
    a = ap.parse_args()
    if a.vision and a.arch != "gemma3":
        ap.error("--vision is for --arch gemma3")
    if a.mtp_from_main and a.arch != "mimo":
        ap.error("--mtp-from-main is for --arch mimo")
    if a.arch in ("gemma3_text", "gemma3") and a.layers < 2:
        ap.error("gemma3 needs 2 layers at least (mlx-lm reads the second's cache)")
    if (a.head_dim is None and a.hidden % a.heads) or a.heads % a.kv_heads:
        ap.error("--hidden must be divisible by --heads (or --head-dim given), and --heads by --kv-heads")
    if a.bits and not a.bench:
        ap.error("--bits is for --bench folders")
    head_dim = a.head_dim or a.hidden // a.heads
    os.makedirs(a.out_dir, exist_ok=True)
    out = lambda name: os.path.join(a.out_dir, name)

    tok = train_tokenizer(a.vocab, GEMMA3_VISION_TOKENS if a.vision else (), plain_fill=a.bench)
    tok.save(out("tokenizer.json"))
    eos_id, bos_id = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")

    arch_name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "gemma3": "Gemma3ForConditionalGeneration",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                 "mimo": "MiMoForCausalLM"}[a.arch]
    config = {
        "model_type": a.arch,
        "architectures": [arch_name],
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": head_dim,
        "intermediate_size": a.intermediate,
        "vocab_size": a.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": a.dtype,
    }
    if a.arch in ("qwen2", "mimo"):
        config["attention_bias"] = True  # qwen2 always has q/k/v biases
    if a.arch == "mimo":
        config["num_nextn_predict_layers"] = a.mtp_layers
    if a.arch == "phi3":
        # Phi-4-mini's partial rotary embeddings and Phi-3-128k's LongRoPE
        # (a 4x longer context than the original: its scale is not 1).
        rotated = int(head_dim * 0.75)
        config["partial_rotary_factor"] = 0.75
        config["max_position_embeddings"] = 8192
        config["original_max_position_embeddings"] = 2048
        config["rope_scaling"] = {
            "type": "longrope",
            "long_factor": [1.0 + 0.5 * i for i in range(rotated // 2)],
            "short_factor": [1.0] * (rotated // 2),
        }
    if a.arch == "gemma3_text":
        config.update(gemma3_text_config(a, head_dim))
        config["architectures"] = [arch_name]
    if a.arch == "gemma3":
        config = {
            "model_type": "gemma3",
            "architectures": [arch_name],
            "text_config": gemma3_text_config(a, head_dim),
            "vision_config": vision_config(a) if a.vision
            else {"model_type": "siglip_vision_model", "hidden_size": 16},
            "vocab_size": a.vocab,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "torch_dtype": a.dtype,
        }
    if a.arch == "gemma3" and a.vision:
        # Top level, where transformers reads it, and in text_config, where
        # mlx-vlm does; the special tokens of Gemma 3's processor.
        config["mm_tokens_per_image"] = a.mm_tokens
        config["text_config"]["mm_tokens_per_image"] = a.mm_tokens
        config["image_token_index"] = tok.token_to_id("<image_soft_token>")
        config["boi_token_index"] = tok.token_to_id("<start_of_image>")
        config["eoi_token_index"] = tok.token_to_id("<end_of_image>")
        config["pad_token_id"] = tok.token_to_id("<pad>")
        # mlx-vlm divides the soft tokens by the square root of the top
        # level's hidden_size (2048 where there is none, as in Google's
        # folders) before its text model multiplies every embedding by the
        # square root of the text model's: the same width here, so that it
        # computes what transformers does (see the native-mlx README).
        config["hidden_size"] = a.hidden
        # The processor's soft tokens per image (it assumes 256 without).
        with open(out("processor_config.json"), "w") as f:
            json.dump({"image_seq_length": a.mm_tokens, "processor_class": "Gemma3Processor"}, f, indent=2)
        with open(out("preprocessor_config.json"), "w") as f:
            json.dump({
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "size": {"height": a.image_size, "width": a.image_size},
                "resample": 2,
                "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "do_convert_rgb": True, "do_pan_and_scan": None,
            }, f, indent=2)
    if a.arch == "qwen3_moe":
        config.update({
            "num_experts": a.experts,
            "num_experts_per_tok": a.experts_per_tok,
            "moe_intermediate_size": a.moe_intermediate,
            "decoder_sparse_step": 1,
            # Qwen3-30B-A3B routes every layer; the tests keep one dense.
            "mlp_only_layers": [] if a.bench else MLP_ONLY_LAYERS,
            "norm_topk_prob": True,
        })
    if a.arch == "gpt_oss":
        # gpt-oss-20b's settings at a smaller scale: alternating sliding and
        # full attention, YaRN RoPE, biases everywhere.
        config.update({
            "attention_bias": True,
            "num_local_experts": a.experts,
            "num_experts_per_tok": a.experts_per_tok,
            "experts_per_token": a.experts_per_tok,
            "layer_types": ["sliding_attention", "full_attention"] * (a.layers // 2)
            + ["sliding_attention"] * (a.layers % 2),
            "sliding_window": a.window,
            "rope_theta": 150000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                             "truncate": False},
            "swiglu_limit": 7.0,
            "rms_norm_eps": 1e-5,
        })
    with open(out("config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(out("generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id}, f, indent=2)
    with open(out("tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "model_max_length": 2048,
            "chat_template": CHAT_TEMPLATE,
        } | ({
            # Gemma 3's: its template and the tokens its processor names.
            "chat_template": GEMMA3_CHAT_TEMPLATE,
            "pad_token": "<pad>",
            "extra_special_tokens": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                     "image_token": "<image_soft_token>"},
        } if a.vision else {}), f, indent=2)

    if a.bits:
        mlx_lm_weights(a.out_dir, config, a)
        print(a.out_dir)
        return
    rng = np.random.default_rng(a.seed)
    weights = make_weights(a, head_dim, TiledRng(rng) if a.bench else rng)
    if a.openai_mxfp4:
        if a.arch != "gpt_oss" or a.dtype != "float32":
            ap.error("--openai-mxfp4 is for gpt_oss in float32")
        openai_mxfp4_experts(weights, a.layers)
        config["quantization_config"] = {"quant_method": "mxfp4"}
        with open(out("config.json"), "w") as f:
            json.dump(config, f, indent=2)
    save_weights(weights, out("model.safetensors"), a.dtype)
    print(a.out_dir)


if __name__ == "__main__":
    main()
