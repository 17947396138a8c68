#!/usr/bin/env python3
"""Token ids from mlx-lm and chat prompts from transformers: the references native-mlx must match.

Reads a JSON request on stdin:
  {"convert": [{"hf_path": DIR, "mlx_path": OUT, "bits": 4, "mode": "affine"}, ...],
   "cases": [{"model": DIR, "prompt": [ids], "max_tokens": N,
              "temp": 0.0, "top_p": 0.0, "top_k": 0, "min_p": 0.0, "seed": 0,
              "logprobs": false}, ...],
   "chats": [{"model": DIR, "template": JINJA, "messages": [...], "tools": [...] | null,
              "add_generation_prompt": true}, ...],
   "scores": [{"model": DIR, "prompt": [ids], "continuation": [ids]}, ...]}
First it quantizes with mlx_lm.convert (the code behind `python -m mlx_lm
convert -q`); then prints {"ids": [[...] per case], "logprobs": [[the
log-probability generate_step gave each id, in float32] for a case with
"logprobs", else null], "chats": [text or
{"error": message} per chat], "scores": [[log-probability of each
continuation id] per score]}. Unset sampling fields mean greedy. Ids go in
and come out, so no tokenizer or chat template takes part in "cases";
mlx_lm's generate_step does not stop at EOS, which is what a fixed-length
comparison needs. "chats" are rendered by transformers' apply_chat_template.
"""
import json
import sys
import time

import mlx.core as mx
from jinja2.exceptions import TemplateError
from mlx_lm import convert, load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from transformers import AutoTokenizer

START = time.monotonic()


def log(what):
    """Progress on stderr, seconds since the imports: where a slow machine spends its time."""
    print(f"mlx_lm_reference: {time.monotonic() - START:7.1f} s {what}", file=sys.stderr, flush=True)


def run(case, models):
    path = case["model"]
    if path not in models:
        models[path] = load(path)[0]
    mx.random.seed(case.get("seed", 0))
    sampler = make_sampler(
        temp=case.get("temp", 0.0),
        top_p=case.get("top_p", 0.0),
        min_p=case.get("min_p", 0.0),
        top_k=case.get("top_k", 0),
    )
    prompt = mx.array(case["prompt"], dtype=mx.uint32)
    steps = generate_step(prompt, models[path], max_tokens=case["max_tokens"], sampler=sampler)
    ids, logprobs = [], []
    for token, step_logprobs in steps:
        ids.append(token)
        logprobs.append(step_logprobs[token].astype(mx.float32).item())
    return ids, (logprobs if case.get("logprobs") else None)


def score(job, models):
    """The log-probability of each continuation id after the ids before it, in float32."""
    path = job["model"]
    if path not in models:
        models[path] = load(path)[0]
    ids = job["prompt"] + job["continuation"]
    logits = models[path](mx.array([ids[:-1]], dtype=mx.uint32))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = logprobs[len(job["prompt"]) - 1:]
    picked = mx.take_along_axis(rows, mx.array(job["continuation"])[:, None], axis=-1)[:, 0]
    return picked.tolist()


def render(chat, tokenizers):
    path = chat["model"]
    if path not in tokenizers:
        tokenizers[path] = AutoTokenizer.from_pretrained(path)
    try:
        return tokenizers[path].apply_chat_template(
            chat["messages"],
            tools=chat.get("tools"),
            chat_template=chat["template"],
            add_generation_prompt=chat.get("add_generation_prompt", True),
            tokenize=False,
        )
    except TemplateError as e:
        return {"error": str(e)}


def main():
    request = json.load(sys.stdin)
    for job in request.get("convert", []):
        # convert() prints progress on stdout, which carries the answer here.
        stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            convert(job["hf_path"], job["mlx_path"], quantize=True, q_bits=job["bits"],
                    q_mode=job.get("mode", "affine"))
        finally:
            sys.stdout = stdout
        log(f"converted {job['mlx_path']}")
    models, tokenizers = {}, {}
    ids, logprobs = [], []
    for case in request.get("cases", []):
        case_ids, case_logprobs = run(case, models)
        ids.append(case_ids)
        logprobs.append(case_logprobs)
        log(f"case {case['model']} (seed {case.get('seed', 0)})")
    chats = []
    for chat in request.get("chats", []):
        chats.append(render(chat, tokenizers))
        log("chat rendered")
    scores = []
    for job in request.get("scores", []):
        scores.append(score(job, models))
        log(f"scored {job['model']}")
    json.dump({"ids": ids, "logprobs": logprobs, "chats": chats, "scores": scores}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
