"""Reference embeddings and rerank scores for the engine tests, computed independently of native-mlx.

Reads one JSON request from stdin:
    {"model": DIR, "texts": [..], "inputs": [[ids], ..], "pairs": [[query, doc], ..]}
and writes {"ids": [[..] per text], "vectors": [[..] per input], "scores": [..] per pair}.
Encoders (BERT, XLM-RoBERTa) run in numpy straight from transformers'
BertModel / XLMRobertaModel / *ForSequenceClassification definitions (float64);
decoder embedders through mlx-lm's model (its final-norm hidden states).
Pooling and normalisation follow the folder's sentence-transformers files.
"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def erf(x):
    return np.vectorize(math.erf)(x)


def encoder_states(w, p, cfg, ids, types):
    """BertModel / RobertaModel's last_hidden_state for one unpadded input."""
    ids = np.array(ids)
    if cfg["model_type"] in ("roberta", "xlm-roberta"):
        pad = cfg.get("pad_token_id", 1)
        mask = ids != pad
        pos = np.cumsum(mask) * mask + pad
    else:
        pos = np.arange(len(ids))
    if cfg.get("type_vocab_size", 2) <= 1:
        types = [0] * len(ids)
    eps = cfg["layer_norm_eps"]
    g = lambda n: w[p + n].astype(np.float64)
    x = g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[pos]
    x = x + g("embeddings.token_type_embeddings.weight")[np.array(types)]
    x = layer_norm(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"), eps)
    heads = cfg["num_attention_heads"]
    d = cfg["hidden_size"] // heads
    lin = lambda x, n: x @ g(n + ".weight").T + g(n + ".bias")
    for i in range(cfg["num_hidden_layers"]):
        l = f"encoder.layer.{i}."
        split = lambda t: t.reshape(len(ids), heads, d).transpose(1, 0, 2)
        q, k, v = (split(lin(x, l + "attention.self." + n)) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(1, 0, 2).reshape(len(ids), -1)
        x = layer_norm(lin(a, l + "attention.output.dense") + x, g(l + "attention.output.LayerNorm.weight"),
                       g(l + "attention.output.LayerNorm.bias"), eps)
        m = lin(x, l + "intermediate.dense")
        m = 0.5 * m * (1.0 + erf(m / math.sqrt(2.0)))
        x = layer_norm(lin(m, l + "output.dense") + x, g(l + "output.LayerNorm.weight"),
                       g(l + "output.LayerNorm.bias"), eps)
    return x, lin, g


def pooling_of(model):
    modules_path = os.path.join(model, "modules.json")
    if not os.path.exists(modules_path):
        return "mean", True
    modules = json.load(open(modules_path))
    pool = next(m for m in modules if m["type"].endswith(".Pooling"))
    pc = json.load(open(os.path.join(model, pool["path"], "config.json")))
    mode = "cls" if pc.get("pooling_mode_cls_token") else "mean" if pc.get("pooling_mode_mean_tokens") else "last"
    return mode, any(m["type"].endswith(".Normalize") for m in modules)


def main():
    req = json.load(sys.stdin)
    model = req["model"]
    cfg = json.load(open(os.path.join(model, "config.json")))
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    out = {"ids": [tok.encode(t).ids for t in req.get("texts", [])], "vectors": [], "scores": []}
    mode, normalize = pooling_of(model)
    if cfg["model_type"] in ("bert", "roberta", "xlm-roberta"):
        w = load_file(os.path.join(model, "model.safetensors"))
        p = next(p for p in ("", "bert.", "roberta.") if p + "embeddings.word_embeddings.weight" in w)
        for ids in req.get("inputs", []):
            h, _, _ = encoder_states(w, p, cfg, ids, [0] * len(ids))
            v = h[0] if mode == "cls" else h.mean(0) if mode == "mean" else h[-1]
            out["vectors"].append(v)
        for q, doc in req.get("pairs", []):
            e = tok.encode(q, doc)
            h, _, _ = encoder_states(w, p, cfg, e.ids, e.type_ids)
            lin = lambda x, n: x @ w[n + ".weight"].astype(np.float64).T + w[n + ".bias"].astype(np.float64)
            if cfg["architectures"][0].startswith("Bert"):
                pooled = np.tanh(lin(h[0], p + "pooler.dense"))
                score = lin(pooled, "classifier")
            else:
                score = lin(np.tanh(lin(h[0], "classifier.dense")), "classifier.out_proj")
            out["scores"].append(float(score[0]))
    else:
        import mlx.core as mx
        from mlx_lm import load

        m, _ = load(model)
        for ids in req.get("inputs", []):
            h = m.model(mx.array([ids]))
            v = np.array(h[0, -1].astype(mx.float32), dtype=np.float64)
            out["vectors"].append(v)
    if normalize:
        out["vectors"] = [v / max(np.linalg.norm(v), 1e-12) for v in out["vectors"]]
    out["vectors"] = [[float(x) for x in v] for v in out["vectors"]]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
