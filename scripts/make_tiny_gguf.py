#!/usr/bin/env python3
"""Writes a tiny random-weight model as one GGUF file, for tests and the
demo: a Llama chat model (the default), with the tokenizer metadata
llama.cpp needs (a SentencePiece-style vocabulary with byte fallback) and a
ChatML chat template, or with `--arch bert` a BERT embedding model, or with
`--arch mmproj` a vision projector for the chat model.

    python3 scripts/make_tiny_gguf.py OUT.gguf [--seed 0] [--hidden 64] [--layers 2] [--tools]
    python3 scripts/make_tiny_gguf.py OUT.gguf --arch bert [--pooling mean|cls] [--seed 0] ...
    python3 scripts/make_tiny_gguf.py mmproj-OUT.gguf --arch mmproj [--projection-dim 64] [--seed 0] ...

`--tools` writes a ChatML template that also renders a request's tools and
the history's tool calls, in no model family's markup (so llama-server
uses its generic, grammar-free handling).

`--arch bert` writes llama.cpp's BERT architecture (the tensor names of
gguf's MODEL_TENSORS[MODEL_ARCH.BERT]): a post-LayerNorm encoder with
learned positions and token types, biases everywhere, non-causal attention,
`bert.pooling_type` from `--pooling`, and a WordPiece vocabulary in
llama.cpp's spelling (a word-initial piece starts with U+2581, a
continuation piece is bare: what convert_hf_to_gguf.py makes of `##`). The
vocabulary holds every lowercase letter, digit and punctuation mark both
ways, and whole words, so any lowercase ASCII text tokenises and a word of
WORDS is one token. Layer norms get random gains and biases, so a reference
that leaves one out does not match.

`--arch mmproj` writes a multimodal projector that llama.cpp's mtmd library
(`llama-server --mmproj`) loads: a LLaVA-style CLIP vision encoder
(`clip.projector_type` "mlp": patch embedding, class embedding, learned
positions, pre-LayerNorm blocks with biases, GELU) and a two-layer MLP
(`mm.0`, GELU, `mm.2`) whose output width, `--projection-dim`, must equal
the text model's `--hidden`. Images are resized to `--image-size` pixels
square and cut into patches of 14, so each image is (image size / 14)^2
embeddings in the prompt: 16 by default.
"""

import argparse
import string

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHATML_TOOLS = (
    "{% if tools %}{{ '<|im_start|>system\n<tools>' }}{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "{{ '</tools><|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% if message.tool_calls %}{% for c in message.tool_calls %}"
    "{{ c.function.name + c.function.arguments }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


WORDS = "the of and to in is you that it he was for on are as with his they at be this from have or by one had not but what all were when we there can an your which their said if do will each about how up out them then she many some so these would other into has more her two like him see time could no make than first been its who now people my made over did down only way find use may water long little very after words called just where most know".split()

# WordPiece specials, at the ids BERT checkpoints' vocabularies do not fix
# (llama.cpp reads them from the metadata).
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS}


def vocabulary():
    """(tokens, scores, types): specials, the 256 byte tokens, then pieces."""
    T = gguf.TokenType
    tokens = [("<unk>", T.UNKNOWN), ("<s>", T.CONTROL), ("</s>", T.CONTROL),
              ("<|im_start|>", T.CONTROL), ("<|im_end|>", T.CONTROL)]
    tokens += [(f"<0x{b:02X}>", T.BYTE) for b in range(256)]
    pieces = ["\u2581"] + list(string.ascii_letters + string.digits + string.punctuation)
    pieces += ["\u2581" + c for c in string.ascii_letters]
    pieces += ["\u2581" + w for w in WORDS]
    tokens += [(p, T.NORMAL) for p in pieces]
    scores = [0.0] * len(tokens)
    for i, (_, kind) in enumerate(tokens):
        if kind == T.NORMAL:
            scores[i] = -float(i)
    return [t for t, _ in tokens], scores, [int(k) for _, k in tokens]


def bert_vocabulary():
    """(tokens, types): the specials, then continuation pieces (bare), then
    word-initial pieces (U+2581 and the piece)."""
    T = gguf.TokenType
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = chars + ["\u2581" + c for c in chars] + ["\u2581" + w for w in WORDS]
    return BERT_SPECIALS + pieces, [int(T.CONTROL)] * len(BERT_SPECIALS) + [int(T.NORMAL)] * len(pieces)


def write_bert(args):
    tokens, types = bert_vocabulary()
    vocab, hidden, ff = len(tokens), args.hidden, args.intermediate
    rng = np.random.default_rng(args.seed)

    def weight(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def gain(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "bert")
    w.add_name("hangar-tiny-bert")
    w.add_context_length(args.context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_block_count(args.layers)
    w.add_head_count(args.heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(BERT_POOLING[args.pooling])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    ids = {t: tokens.index(t) for t in BERT_SPECIALS}
    w.add_pad_token_id(ids["[PAD]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_bos_token_id(ids["[CLS]"])  # llama.cpp opens a WordPiece input with its BOS
    w.add_sep_token_id(ids["[SEP]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)

    w.add_tensor("token_embd.weight", weight(vocab, hidden, scale=1.0))
    w.add_tensor("token_types.weight", weight(2, hidden, scale=1.0))
    w.add_tensor("position_embd.weight", weight(args.context, hidden, scale=1.0))
    w.add_tensor("token_embd_norm.weight", gain(hidden))
    w.add_tensor("token_embd_norm.bias", weight(hidden, scale=0.1))
    for i in range(args.layers):
        b = f"blk.{i}."
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", hidden, hidden),
                                 ("attn_v", hidden, hidden), ("attn_output", hidden, hidden),
                                 ("ffn_up", ff, hidden), ("ffn_down", hidden, ff)):
            w.add_tensor(b + name + ".weight", weight(rows, cols))
            w.add_tensor(b + name + ".bias", weight(rows, scale=0.1))
        for name in ("attn_output_norm", "layer_output_norm"):
            w.add_tensor(b + name + ".weight", gain(hidden))
            w.add_tensor(b + name + ".bias", weight(hidden, scale=0.1))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_mmproj(args):
    hidden, ff, patch = args.hidden, args.intermediate, 14
    if args.image_size % patch:
        raise SystemExit(f"--image-size {args.image_size} is not a multiple of the patch size {patch}")
    positions = (args.image_size // patch) ** 2 + 1  # the patches and the class embedding
    rng = np.random.default_rng(args.seed)

    def weight(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "clip")
    w.add_name("hangar-tiny-mmproj")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("mlp")  # gguf names no constant for LLaVA's projector
    w.add_vision_image_size(args.image_size)
    w.add_vision_patch_size(patch)
    w.add_vision_embedding_length(hidden)
    w.add_vision_feed_forward_length(ff)
    w.add_vision_projection_dim(args.projection_dim)
    w.add_vision_block_count(args.layers)
    w.add_vision_head_count(args.heads)
    w.add_vision_attention_layernorm_eps(1e-5)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    w.add_vision_use_gelu(True)

    # Shapes as PyTorch holds them (out, in); gguf reverses them for ggml.
    w.add_tensor("v.patch_embd.weight", weight(hidden, 3, patch, patch))
    w.add_tensor("v.class_embd", weight(hidden))
    w.add_tensor("v.position_embd.weight", weight(positions, hidden))
    w.add_tensor("v.pre_ln.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("v.pre_ln.bias", np.zeros(hidden, dtype=np.float32))
    for i in range(args.layers):
        b = f"v.blk.{i}."
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", hidden, hidden),
                                 ("attn_v", hidden, hidden), ("attn_out", hidden, hidden),
                                 ("ffn_up", ff, hidden), ("ffn_down", hidden, ff)):
            w.add_tensor(b + name + ".weight", weight(rows, cols))
            w.add_tensor(b + name + ".bias", weight(rows))
        for name in ("ln1", "ln2"):
            w.add_tensor(b + name + ".weight", np.ones(hidden, dtype=np.float32))
            w.add_tensor(b + name + ".bias", np.zeros(hidden, dtype=np.float32))
    w.add_tensor("mm.0.weight", weight(args.projection_dim, hidden))
    w.add_tensor("mm.0.bias", weight(args.projection_dim))
    w.add_tensor("mm.2.weight", weight(args.projection_dim, args.projection_dim))
    w.add_tensor("mm.2.bias", weight(args.projection_dim))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tools", action="store_true", help="a chat template that renders tools")
    ap.add_argument("--arch", choices=["llama", "bert", "mmproj"], default="llama")
    ap.add_argument("--pooling", choices=sorted(BERT_POOLING), default="mean",
                    help="bert only: how llama-server pools the token vectors")
    ap.add_argument("--projection-dim", type=int, default=64,
                    help="mmproj only: the width of the text model it feeds (its --hidden)")
    ap.add_argument("--image-size", type=int, default=56,
                    help="mmproj only: the side, in pixels, images are resized to")
    args = ap.parse_args()
    if args.arch == "bert":
        write_bert(args)
        return
    if args.arch == "mmproj":
        write_mmproj(args)
        return

    tokens, scores, types = vocabulary()
    vocab, hidden = len(tokens), args.hidden
    head_dim = hidden // args.heads
    rng = np.random.default_rng(args.seed)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("hangar-tiny-llama")
    w.add_context_length(args.context)
    w.add_embedding_length(hidden)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.intermediate)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(4)  # <|im_end|> ends a ChatML turn
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML_TOOLS if args.tools else CHATML)

    w.add_tensor("token_embd.weight", weight(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    # Only ordinary pieces get random output rows: control and byte tokens
    # score 0 and are (almost) never chosen, so greedy output is readable
    # text that runs to max_tokens instead of ending at a random EOS.
    output = weight(vocab, hidden)
    output[[i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]] = 0.0
    w.add_tensor("output.weight", output)
    kv = args.kv_heads * head_dim
    for i in range(args.layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(b + "attn_q.weight", weight(hidden, hidden))
        w.add_tensor(b + "attn_k.weight", weight(kv, hidden))
        w.add_tensor(b + "attn_v.weight", weight(kv, hidden))
        w.add_tensor(b + "attn_output.weight", weight(hidden, hidden))
        w.add_tensor(b + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", weight(args.intermediate, hidden))
        w.add_tensor(b + "ffn_up.weight", weight(args.intermediate, hidden))
        w.add_tensor(b + "ffn_down.weight", weight(hidden, args.intermediate))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
