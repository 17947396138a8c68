#!/usr/bin/env python3
"""Exports a BERT embedding model folder (Hugging Face layout: config.json,
model.safetensors, tokenizer files) as an ONNX graph that ONNX Runtime (and
so fastembed) runs, for the embeddings benchmark: the same weights for every
engine, with no torch and nothing from a hub.

    python bert_onnx.py MODEL_DIR OUT_DIR

OUT_DIR gets `onnx/model.onnx` (inputs input_ids, attention_mask,
token_type_ids, all int64 [batch, sequence]; output last_hidden_state,
float32 [batch, sequence, hidden]) and copies of the tokenizer and config
files, which is the layout fastembed loads with `specific_model_path`.
Pooling and normalisation are left to the runtime's caller, as fastembed
does them. The graph is BERT's, written from the architecture (post-norm
encoder layers, erf GELU, absolute positions); `model_type` must be `bert`.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

COPIED = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "vocab.txt", "modules.json", "sentence_bert_config.json"]


def export(model_dir: Path, out_dir: Path) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "bert":
        raise SystemExit(f"{model_dir}: model_type {config.get('model_type')!r}; this exporter writes BERT only")
    weights: dict[str, np.ndarray] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    prefix = "bert." if any(k.startswith("bert.") for k in weights) else ""

    def w(name: str) -> np.ndarray:
        return weights[prefix + name].astype(np.float32)

    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    eps = float(config.get("layer_norm_eps", 1e-12))
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    counter = [0]

    def node(op: str, inputs: list[str], **attrs) -> str:
        counter[0] += 1
        out = f"{op.lower()}_{counter[0]}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def linear(x: str, name: str) -> str:
        weight = const(f"{name}.weight.T", np.ascontiguousarray(w(f"{name}.weight").T))
        bias = const(f"{name}.bias", w(f"{name}.bias"))
        return node("Add", [node("MatMul", [x, weight]), bias])

    def norm(x: str, name: str) -> str:
        return node("LayerNormalization", [x, const(f"{name}.weight", w(f"{name}.weight")),
                                           const(f"{name}.bias", w(f"{name}.bias"))], axis=-1, epsilon=eps)

    words = node("Gather", [const("word_embeddings", w("embeddings.word_embeddings.weight")), "input_ids"])
    seq = node("Gather", [node("Shape", ["input_ids"]), const("one_i", np.array(1, dtype=np.int64))])
    positions = node("Range", [const("zero_i", np.array(0, dtype=np.int64)), seq, "one_i"])
    pos = node("Gather", [const("position_embeddings", w("embeddings.position_embeddings.weight")), positions])
    types = node("Gather", [const("token_type_embeddings", w("embeddings.token_type_embeddings.weight")),
                            "token_type_ids"])
    x = norm(node("Add", [node("Add", [words, pos]), types]), "embeddings.LayerNorm")

    # Padding: -10000 on masked keys, broadcast over heads and queries.
    mask = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    masked = node("Mul", [node("Sub", [const("one_f", np.array(1.0, dtype=np.float32)), mask]),
                          const("minus", np.array(-10000.0, dtype=np.float32))])
    bias = node("Unsqueeze", [masked, const("axes_12", np.array([1, 2], dtype=np.int64))])
    split = const("split_shape", np.array([0, 0, heads, head_dim], dtype=np.int64))
    merge = const("merge_shape", np.array([0, 0, hidden], dtype=np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    root2 = const("root2", np.array(np.sqrt(2.0), dtype=np.float32))

    for i in range(config["num_hidden_layers"]):
        layer = f"encoder.layer.{i}"
        q = node("Transpose", [node("Reshape", [linear(x, f"{layer}.attention.self.query"), split])],
                 perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(x, f"{layer}.attention.self.key"), split])],
                 perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(x, f"{layer}.attention.self.value"), split])],
                 perm=[0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), bias])
        context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge])
        attended = linear(context, f"{layer}.attention.output.dense")
        x = norm(node("Add", [x, attended]), f"{layer}.attention.output.LayerNorm")
        h = linear(x, f"{layer}.intermediate.dense")
        gelu = node("Mul", [node("Mul", [h, half]),
                            node("Add", [node("Erf", [node("Div", [h, root2])]), "one_f"])])
        x = norm(node("Add", [x, linear(gelu, f"{layer}.output.dense")]), f"{layer}.output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))

    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    graph = helper.make_graph(nodes, "bert", ids, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    (out_dir / "onnx").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_dir / "onnx" / "model.onnx"))
    for name in COPIED:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out_dir / name)
    for pooling in model_dir.glob("*_Pooling"):
        shutil.copytree(pooling, out_dir / pooling.name, dirs_exist_ok=True)
    return out_dir / "onnx" / "model.onnx"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(export(Path(sys.argv[1]), Path(sys.argv[2])))
