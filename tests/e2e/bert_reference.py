"""A numpy reference of llama.cpp's BERT embedding forward, computed from a
GGUF's own weights (read back with gguf.GGUFReader, as llama.cpp reads
them), so that the tests can check llama-server's vectors, through Hangar,
against arithmetic that shares no code with it.

It follows llama.cpp's graph for `bert`: token, position and token-type-0
embeddings summed, LayerNorm; per layer, non-causal multi-head attention
with biases, residual, LayerNorm (post-LN), a GELU feed-forward with
biases, residual, LayerNorm; then the pooling `bert.pooling_type` names
(1 mean over all tokens, [CLS] and [SEP] included; 2 the first token) and,
as llama-server does by default, L2 normalisation. GELU is the tanh
approximation, which is what ggml's GELU computes. Everything is float64,
so the difference to llama.cpp's float32 is llama.cpp's rounding.

`tokenize` is WordPiece only where it is unambiguous: it lowercases, splits
on whitespace and wants every word to be one whole-word token; anything
else raises, so a test cannot silently compare different token ids.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader

WORD_START = "\u2581"


class Bert:
    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {name: field.contents() for name, field in r.fields.items()}
        assert self.meta["general.architecture"] == "bert", self.meta["general.architecture"]
        self.t = {t.name: np.asarray(t.data, dtype=np.float64) for t in r.tensors}
        self.layers = int(self.meta["bert.block_count"])
        self.heads = int(self.meta["bert.attention.head_count"])
        self.eps = float(self.meta["bert.attention.layer_norm_epsilon"])
        self.pooling = int(self.meta["bert.pooling_type"])
        self.dim = int(self.meta["bert.embedding_length"])
        tokens = self.meta["tokenizer.ggml.tokens"]
        self.ids = {tok: i for i, tok in enumerate(tokens)}
        self.cls = int(self.meta["tokenizer.ggml.bos_token_id"])
        self.sep = int(self.meta["tokenizer.ggml.seperator_token_id"])
        self.vocab = len(tokens)

    def tokenize(self, text: str) -> list[int]:
        """[CLS], one token per whitespace-separated word, [SEP]."""
        ids = []
        for word in text.lower().split():
            piece = WORD_START + word
            if piece not in self.ids:
                raise ValueError(f"{word!r} is not one whole-word token of the vocabulary")
            ids.append(self.ids[piece])
        return [self.cls, *ids, self.sep]

    def _norm(self, x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.t[name + ".weight"] + self.t[name + ".bias"]

    def _linear(self, x, name):
        return x @ self.t[name + ".weight"].T + self.t[name + ".bias"]

    def hidden(self, ids: list[int]) -> np.ndarray:
        """The last layer's token vectors, (tokens, dim)."""
        t, n = self.t, len(ids)
        x = t["token_embd.weight"][ids] + t["position_embd.weight"][:n] + t["token_types.weight"][0]
        x = self._norm(x, "token_embd_norm")
        head = self.dim // self.heads
        for i in range(self.layers):
            b = f"blk.{i}."

            def split(y):
                return y.reshape(n, self.heads, head).transpose(1, 0, 2)

            q, k, v = (split(self._linear(x, b + w)) for w in ("attn_q", "attn_k", "attn_v"))
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(head)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = (scores / scores.sum(-1, keepdims=True)) @ v
            attn = attn.transpose(1, 0, 2).reshape(n, self.dim)
            x = self._norm(x + self._linear(attn, b + "attn_output"), b + "attn_output_norm")
            up = self._linear(x, b + "ffn_up")
            gelu = 0.5 * up * (1 + np.tanh(np.sqrt(2 / np.pi) * (up + 0.044715 * up**3)))
            x = self._norm(x + self._linear(gelu, b + "ffn_down"), b + "layer_output_norm")
        return x

    def embed(self, ids: list[int]) -> np.ndarray:
        """The pooled, L2-normalised vector of one input's token ids."""
        h = self.hidden(ids)
        if self.pooling == 1:
            v = h.mean(0)
        elif self.pooling == 2:
            v = h[0]
        else:
            raise ValueError(f"pooling type {self.pooling} is not modelled here")
        return v / np.linalg.norm(v)

    def embed_text(self, text: str) -> np.ndarray:
        return self.embed(self.tokenize(text))
