#!/usr/bin/env python3
"""The CPU baselines of the embeddings benchmark: fastembed (ONNX Runtime,
what CPU users pick) and ONNX Runtime alone, on the same BERT weights as
native-mlx, exported by bert_onnx.py. One process per engine and round, so
that scripts/embed-bench.sh can interleave them with native-mlx's rounds.

    python embed_baselines.py ENGINE MODEL_DIR ONNX_DIR --batches 1,32,256 --tokens 64 [--repeat N]

ENGINE is `fastembed` or `onnxruntime`. Prints one JSON line per batch
size: {"engine", "batch", "tokens", "seconds" (the median of --repeat
timed calls after one warm-up), "per_second" (inputs per second), "dim",
"first" (the first input's vector, for the cross-engine check)}.

The inputs are texts that the model's tokenizer turns into exactly TOKENS
tokens with its special tokens, made of words from its own vocabulary, so
that every engine reads the same ids.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def texts(model_dir: Path, tokens: int, count: int) -> list[str]:
    """`count` distinct texts of exactly `tokens` tokens each."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    words = [w for w, _ in vocab if w.isalpha() and w.islower() and len(w) > 1]
    if not words:
        raise SystemExit(f"{model_dir}: the vocabulary has no plain words to build inputs from")
    special = len(tokenizer.encode("").ids)
    out = []
    for i in range(count):
        body = [words[(i * 7 + j) % len(words)] for j in range(tokens - special)]
        text = " ".join(body)
        n = len(tokenizer.encode(text).ids)
        if n != tokens:
            raise SystemExit(f"an input came to {n} tokens, not {tokens}; the vocabulary splits its words")
        out.append(text)
    return out


def pooling(model_dir: Path) -> str:
    """`cls` or `mean`, as the sentence-transformers config says (mean without one)."""
    modules = model_dir / "modules.json"
    if modules.is_file():
        for m in json.loads(modules.read_text()):
            if m.get("type", "").endswith(".Pooling"):
                config = json.loads((model_dir / m["path"] / "config.json").read_text())
                if config.get("pooling_mode_cls_token"):
                    return "cls"
    return "mean"


def fastembed_engine(model_dir: Path, onnx_dir: Path, dim: int):
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    TextEmbedding.add_custom_model(
        model="hangar/bench-embedder",
        pooling=PoolingType.CLS if pooling(model_dir) == "cls" else PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf="hangar/bench-embedder"),
        dim=dim,
        model_file="onnx/model.onnx",
    )
    model = TextEmbedding("hangar/bench-embedder", specific_model_path=str(onnx_dir))
    return lambda batch: np.stack(list(model.embed(batch, batch_size=len(batch))))


def onnxruntime_engine(model_dir: Path, onnx_dir: Path, dim: int):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_padding()
    session = ort.InferenceSession(str(onnx_dir / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    cls = pooling(model_dir) == "cls"

    def run(batch):
        encoded = tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask,
                                    "token_type_ids": np.zeros_like(ids)})[0]
        if cls:
            pooled = hidden[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(1) / m.sum(1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["fastembed", "onnxruntime"])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("onnx_dir", type=Path)
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    dim = json.loads((args.model_dir / "config.json").read_text())["hidden_size"]
    make = fastembed_engine if args.engine == "fastembed" else onnxruntime_engine
    run = make(args.model_dir, args.onnx_dir, dim)
    for batch in [int(b) for b in args.batches.split(",")]:
        inputs = texts(args.model_dir, args.tokens, batch)
        first = run(inputs)  # warm-up
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            run(inputs)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        print(json.dumps({"engine": args.engine, "batch": batch, "tokens": args.tokens,
                          "seconds": seconds, "per_second": batch / seconds, "dim": dim,
                          "first": [round(float(x), 6) for x in first[0]]}), flush=True)


if __name__ == "__main__":
    main()
