#!/usr/bin/env python3
"""Writes a random-weight embedding or reranking model folder for tests and benchmarks.

    python scripts/make_tiny_embedder.py KIND OUT_DIR [--seed N] [--size tiny|base] [--dtype D]

KIND (the folder is what Hugging Face / sentence-transformers would write):
  bert         BertModel embedder: WordPiece tokenizer.json ([PAD] [UNK] [CLS]
               [SEP] [MASK]), modules.json with CLS pooling and Normalize,
               1_Pooling/config.json, sentence_bert_config.json
               (max_seq_length 128)
  xlmr         XLMRobertaModel embedder: Unigram tokenizer (<s> <pad> </s>
               <unk>), mean pooling, Normalize, max_seq_length 128
  xlmr-rerank  XLMRobertaForSequenceClassification cross-encoder, num_labels 1
  bert-rerank  BertForSequenceClassification cross-encoder, num_labels 1
  qwen3        a qwen3 decoder (scripts/make_tiny_model.py's) with modules.json:
               last-token pooling and Normalize (Qwen3-Embedding's layout)

--size tiny (default): hidden 32, 2 layers, 4 heads, vocab ~300-512; fast
enough for unit tests. --size base (encoders only): bge-small's dimensions
(hidden 384, 12 layers, 12 heads, intermediate 1536, vocab 30522, 512
positions), for benchmarks. Weights are float32 unless --dtype says
otherwise. Output is deterministic for a given KIND, --seed and --size;
nothing is downloaded (numpy, safetensors and the tokenizers library only).
Prints OUT_DIR.
"""
import argparse
import importlib.util
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = """\
The quick brown fox jumps over the lazy dog. A search engine ranks documents
by how well they answer a query; an embedding model turns each text into a
vector, and a reranker reads a query and a document together and scores them.
Hello, world! Paris is the capital of France. Berlin is the capital of Germany.
Local inference engines read a folder of weights, a tokenizer and a config.
Once upon a time there was a little hangar at the edge of a quiet airfield.
Numbers 0 1 2 3 4 5 6 7 8 9; colours red, green, blue; (a) [b] {c}.
"""
SIZES = {
    "tiny": dict(hidden=32, layers=2, heads=4, intermediate=64, vocab=None, positions=514),
    "base": dict(hidden=384, layers=12, heads=12, intermediate=1536, vocab=30522, positions=512),
}
MAX_SEQ_LENGTH = 128


def wordpiece_tokenizer(vocab_size):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # Built, not trained (the trainer is not deterministic): the corpus's
    # words as BERT splits them, its characters, and their "##" forms.
    split = pre_tokenizers.BertPreTokenizer().pre_tokenize_str(CORPUS.lower())
    words = sorted({w for w, _ in split})
    chars = sorted({c for w in words for c in w})
    vocab = {}
    for t in specials + chars + ["##" + c for c in chars] + words:
        vocab.setdefault(t, len(vocab))
    # A realistic vocabulary size: fill with the [unused] entries BERT has.
    for i in range((vocab_size or 0) - len(vocab)):
        vocab[f"[unused{i}]"] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok, vocab["[PAD]"]


def unigram_tokenizer(vocab_size):
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    # Built, not trained: the Unigram trainer is not deterministic. Pieces
    # are the corpus's words (with SentencePiece's word mark) and characters,
    # scored by how often they occur.
    words, chars = {}, {}
    for word in CORPUS.split():
        words["\u2581" + word] = words.get("\u2581" + word, 0) + 1
        for c in word:
            chars[c] = chars.get(c, 0) + 1
    pieces = [(t, 0.0) for t in specials] + [("\u2581", -2.0)]
    pieces += [(c, -3.0 - 1.0 / n) for c, n in sorted(chars.items())]
    pieces += [("\u2581" + c, -4.0) for c in sorted(chars)]
    pieces += [(w, -1.0 - 1.0 / n) for w, n in sorted(words.items()) if len(w) > 2]
    seen = set()
    pieces = [p for p in pieces if not (p[0] in seen or seen.add(p[0]))]
    for i in range((vocab_size or 0) - len(pieces)):
        pieces.append((f"<extra_{i}>", -20.0))
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    ids = {t: tok.token_to_id(t) for t in specials}
    if [ids[t] for t in specials] != [0, 1, 2, 3]:
        raise SystemExit(f"unexpected special ids {ids}")
    # XLM-RoBERTa's pair layout: <s> A </s> </s> B </s>, one token type.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok, ids["<pad>"]


def encoder_weights(s, vocab, types, positions, prefix, rng):
    h, inter = s["hidden"], s["intermediate"]
    rand = lambda *shape: rng.normal(0.0, 0.05, size=shape).astype(np.float32)
    norm = lambda n: (1.0 + rng.normal(0.0, 0.1, size=n)).astype(np.float32)
    p = prefix
    w = {
        p + "embeddings.word_embeddings.weight": rand(vocab, h),
        p + "embeddings.position_embeddings.weight": rand(positions, h),
        p + "embeddings.token_type_embeddings.weight": rand(types, h),
        p + "embeddings.LayerNorm.weight": norm(h),
        p + "embeddings.LayerNorm.bias": rand(h),
    }
    for i in range(s["layers"]):
        l = f"{p}encoder.layer.{i}."
        for name, shape in [
            ("attention.self.query", (h, h)),
            ("attention.self.key", (h, h)),
            ("attention.self.value", (h, h)),
            ("attention.output.dense", (h, h)),
            ("intermediate.dense", (inter, h)),
            ("output.dense", (h, inter)),
        ]:
            w[l + name + ".weight"] = rand(*shape)
            w[l + name + ".bias"] = rand(shape[0])
        for name in ["attention.output.LayerNorm", "output.LayerNorm"]:
            w[l + name + ".weight"] = norm(h)
            w[l + name + ".bias"] = rand(h)
    return w


def save_weights(weights, path, dtype):
    spec = importlib.util.spec_from_file_location("make_tiny_model", os.path.join(HERE, "make_tiny_model.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tiny.save_weights(weights, path, dtype)


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def sentence_transformers(out, pooling, dim, max_seq_length):
    """modules.json, the Pooling module's config, Normalize, sentence_bert_config.json."""
    write_json(out("modules.json"), [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    config = {"word_embedding_dimension": dim}
    config.update({m: key == pooling for key, m in modes.items()})
    config.update({"pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})
    write_json(out("1_Pooling/config.json"), config)
    os.makedirs(out("2_Normalize"), exist_ok=True)
    if max_seq_length:
        write_json(out("sentence_bert_config.json"), {"max_seq_length": max_seq_length, "do_lower_case": False})


def encoder(kind, a, out, rng):
    s = SIZES[a.size]
    bert = kind.startswith("bert")
    rerank = kind.endswith("-rerank")
    if bert:
        tok, pad = wordpiece_tokenizer(s["vocab"])
        positions, types = s["positions"], 2
    else:
        tok, pad = unigram_tokenizer(s["vocab"])
        # RoBERTa's positions start at padding_idx + 1: 2 more rows than it reads.
        positions, types = s["positions"] + 2, 1
    tok.save(out("tokenizer.json"))
    vocab = tok.get_vocab_size()
    model_type = "bert" if bert else "xlm-roberta"
    arch = ("Bert" if bert else "XLMRoberta") + ("ForSequenceClassification" if rerank else "Model")
    config = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "intermediate_size": s["intermediate"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": positions,
        "type_vocab_size": types,
        "vocab_size": vocab,
        "layer_norm_eps": 1e-12 if bert else 1e-5,
        "pad_token_id": pad,
        "position_embedding_type": "absolute",
        "torch_dtype": a.dtype,
    }
    if not bert:
        config.update({"bos_token_id": 0, "eos_token_id": 2})
    if rerank:
        config.update({"num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}})
    write_json(out("config.json"), config)
    special = (
        {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
        if bert
        else {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    )
    write_json(out("tokenizer_config.json"), {
        "tokenizer_class": "BertTokenizer" if bert else "XLMRobertaTokenizer",
        "model_max_length": MAX_SEQ_LENGTH if not rerank else s["positions"],
        **special,
    })
    h = s["hidden"]
    prefix = ("bert." if bert else "roberta.") if rerank else ""
    w = encoder_weights(s, vocab, types, positions, prefix, rng)
    rand = lambda *shape: rng.normal(0.0, 0.05, size=shape).astype(np.float32)
    if bert:
        # BertModel and BertForSequenceClassification both keep the pooler.
        w[prefix + "pooler.dense.weight"], w[prefix + "pooler.dense.bias"] = rand(h, h), rand(h)
    if rerank and bert:
        w["classifier.weight"], w["classifier.bias"] = rand(1, h), rand(1)
    elif rerank:
        w["classifier.dense.weight"], w["classifier.dense.bias"] = rand(h, h), rand(h)
        w["classifier.out_proj.weight"], w["classifier.out_proj.bias"] = rand(1, h), rand(1)
    else:
        sentence_transformers(out, "cls" if bert else "mean", h, MAX_SEQ_LENGTH)
    save_weights(w, out("model.safetensors"), a.dtype)


def decoder(a, out):
    if a.size != "tiny":
        raise SystemExit("qwen3: only --size tiny")
    argv = [a.out_dir, "--arch", "qwen3", "--seed", str(a.seed), "--dtype", a.dtype]
    spec = importlib.util.spec_from_file_location("make_tiny_model", os.path.join(HERE, "make_tiny_model.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    saved, sys.argv = sys.argv, [sys.argv[0]] + argv
    try:
        tiny.main()
    finally:
        sys.argv = saved
    with open(out("config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    sentence_transformers(out, "last", hidden, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["bert", "xlmr", "xlmr-rerank", "bert-rerank", "qwen3"])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    out = lambda name: os.path.join(a.out_dir, name)
    if a.kind == "qwen3":
        decoder(a, out)
        return
    encoder(a.kind, a, out, np.random.default_rng(a.seed))
    print(a.out_dir)


if __name__ == "__main__":
    main()
