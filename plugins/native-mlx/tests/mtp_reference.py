#!/usr/bin/env python3
"""MiMo's multi-token-prediction layer computed as Hugging Face and vLLM define it: the reference native-mlx must match.

Reads a JSON request on stdin:
  {"cases": [{"model": DIR, "tokens": [ids], "k": K}, ...],
   "quantize": [{"from": DIR, "to": DIR, "bits": 4, "group_size": 64}, ...]}
For each case it prints, in {"cases": [...]}, {"logits": [...], "guesses":
[...], "wrong": {...}}: "logits" the first MTP layer's float32 logits at every position of
"tokens" but the last, row by row (row p reads the model's hidden state at
p and the embedding of token p + 1), and "guesses" the layer's K greedy
guesses of the tokens after "tokens", applied recursively (its own output
in place of the model's hidden state, its guess in place of the token),
"wrong" the logits of two wrong readings of the layer ("swapped": the
embedding before the hidden state; "post_norm": the hidden state after
the model's final norm), which a check must tell from "logits".

The model's network is mlx-lm's `mimo` (which drops the MTP weights); the
layer is written here from Hugging Face's `MiMoMTPLayers` and vLLM's
`MiMoMultiTokenPredictorLayer`:
  e = token_layernorm(embed(token p + 1)), zeroed at position 0 (vLLM)
  h = hidden_layernorm(hidden state at p, before the model's final norm:
      vLLM's MiMoModel returns hidden_states + residual, and
      compute_logits applies model.norm itself)
  x = input_proj(concat([h, e]))          # hidden first
  y = final_layernorm(Qwen2 decoder block(x), own KV cache, RoPE at p)
  logits = lm_head(y)                     # the model's shared head
with the block as mlx-lm's mimo `TransformerBlock` (the same Qwen2 block).

"quantize" first writes, for each entry, the MTP weights of "from" (a float
mimo folder) quantized as `mlx.nn.quantize` quantizes a model's linear
layers (affine, "bits", "group_size") into "to"/model-mtp.safetensors, next
to a folder mlx_lm.convert made of "from" (which dropped them): what a
converter that keeps the layers would write.
"""
import json
import os
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.mimo import ModelArgs, TransformerBlock

LINEARS = ("input_proj", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
           "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def quantize(job):
    weights = mx.load(f"{job['from']}/model.safetensors")
    out = {}
    for name, w in weights.items():
        if not name.startswith("model.mtp_layers."):
            continue
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.split(".", 3)[3] in LINEARS:
            q, scales, biases = mx.quantize(w, group_size=job["group_size"], bits=job["bits"])
            out[name] = q
            out[f"{module}.scales"] = scales
            out[f"{module}.biases"] = biases
        else:
            out[name] = w
    mx.save_safetensors(f"{job['to']}/model-mtp.safetensors", out, metadata={"format": "mlx"})


class Mtp:
    """The first MTP layer of a mimo folder, and the model it belongs to."""

    def __init__(self, path):
        self.model, _ = load(path)
        with open(f"{path}/config.json") as f:
            config = json.load(f)
        self.eps = config["rms_norm_eps"]
        weights = {}
        for name, w in mx.load(f"{path}/model.safetensors").items():
            if name.startswith("model.mtp_layers.0."):
                weights[name[len("model.mtp_layers.0."):]] = w
        if os.path.exists(f"{path}/model-mtp.safetensors"):
            for name, w in mx.load(f"{path}/model-mtp.safetensors").items():
                if name.startswith("model.mtp_layers.0."):
                    weights[name[len("model.mtp_layers.0."):]] = w
        self.block = TransformerBlock(ModelArgs.from_dict(config))
        if "self_attn.q_proj.scales" in weights:
            q = config["quantization"]
            import mlx.nn as nn
            nn.quantize(self.block, group_size=q["group_size"], bits=q["bits"])
        self.block.load_weights([(n, w) for n, w in weights.items() if n.split(".")[0] in
                                 ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")])
        self.w = weights
        if "input_proj.scales" in weights:
            self.input_proj = lambda x: mx.quantized_matmul(
                x, weights["input_proj.weight"], weights["input_proj.scales"],
                weights["input_proj.biases"], transpose=True,
                group_size=config["quantization"]["group_size"], bits=config["quantization"]["bits"])
        else:
            self.input_proj = lambda x: x @ weights["input_proj.weight"].T

    def hidden(self, tokens):
        """The model's hidden states before its final norm."""
        m = self.model.model
        h = m.embed_tokens(mx.array([tokens], dtype=mx.uint32))
        mask = create_attention_mask(h, None)
        for layer in m.layers:
            h = layer(h, mask, None)
        return h

    def layer(self, hidden, tokens, cache, swapped=False):
        e = self.model.model.embed_tokens(tokens)
        if cache.offset == 0:
            e = mx.concatenate([mx.zeros_like(e[:, :1]), e[:, 1:]], axis=1)
        e = mx.fast.rms_norm(e, self.w["token_layernorm.weight"], self.eps)
        h = mx.fast.rms_norm(hidden, self.w["hidden_layernorm.weight"], self.eps)
        x = self.input_proj(mx.concatenate([e, h] if swapped else [h, e], axis=-1))
        mask = create_attention_mask(x, cache)
        y = self.block(x, mask, cache)
        return mx.fast.rms_norm(y, self.w["final_layernorm.weight"], self.eps)

    def head(self, y):
        if self.model.args.tie_word_embeddings:
            return self.model.model.embed_tokens.as_linear(y)
        return self.model.lm_head(y)


def run(case, models):
    path = case["model"]
    if path not in models:
        models[path] = Mtp(path)
    mtp = models[path]
    tokens = case["tokens"]
    hidden = mtp.hidden(tokens)
    cache = KVCache()
    out = mtp.layer(hidden[:, :-1], mx.array([tokens[1:]], dtype=mx.uint32), cache)
    logits = mtp.head(out).astype(mx.float32)
    # What a wrong layer would give: the concatenation the other way round
    # (DeepSeek's order), and the hidden states after the final norm.
    swapped = mtp.layer(hidden[:, :-1], mx.array([tokens[1:]], dtype=mx.uint32), KVCache(), swapped=True)
    normed = mx.fast.rms_norm(hidden, mtp.model.model.norm.weight, mtp.eps)
    post_norm = mtp.layer(normed[:, :-1], mx.array([tokens[1:]], dtype=mx.uint32), KVCache())
    wrong = {"swapped": mtp.head(swapped).astype(mx.float32).reshape(-1).tolist(),
             "post_norm": mtp.head(post_norm).astype(mx.float32).reshape(-1).tolist()}
    guesses = []
    last = out[:, -1:]
    for step in range(case["k"]):
        token = mx.argmax(mtp.head(last)[:, -1], axis=-1)
        guesses.append(token.item())
        if step + 1 < case["k"]:
            last = mtp.layer(last, token.reshape(1, 1).astype(mx.uint32), cache)
    return {"logits": logits.reshape(-1).tolist(), "guesses": guesses, "wrong": wrong}


def main():
    request = json.load(sys.stdin)
    for job in request.get("quantize", []):
        quantize(job)
    models = {}
    print(json.dumps({"cases": [run(c, models) for c in request.get("cases", [])]}))


if __name__ == "__main__":
    main()
