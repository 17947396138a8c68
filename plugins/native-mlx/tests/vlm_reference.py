"""Reference prompts and greedy answers for the engine's vision-language tests, from mlx-vlm.

Reads one JSON request from stdin:
    {"model": DIR, "convert": [{"mlx_path": DIR, "bits": B, "vision": BOOL}, ..],
     "images": [{"path": FILE, "width": W, "height": H, "from": [R, G, B], "to": [R, G, B],
                 "vertical": BOOL, "seed": S}, ..],
     "cases": [{"messages": [..], "images": [FILE, ..], "max_tokens": N,
                "embeddings": BOOL, "model": DIR}, ..]}
writes each image as an RGB PNG (RGB: mlx-vlm's loader drops an alpha
channel where transformers' processor composites it on white): a colour
gradient from "from" to "to", down or across, with seeded noise. Gradients,
not noise alone: the tiny model's answer then depends on which image it
sees and on the order of an image's soft tokens (the means of two noise
images are all but the same). Each "convert" entry writes DIR quantized as
vision_reference.py's does (mlx_vlm.convert's default keeps the tower and
projector dense; "vision" quantizes the tower's linear layers too). Then for
each case, on its "model" (by default the first), it renders the messages
with the model's chat template (transformers' apply_chat_template, content
parts as given: {"type": "image"} where an image goes), prepares the inputs
as mlx-vlm's generate does (mlx_vlm.utils.prepare_inputs: Gemma3Processor
expands each <start_of_image>, the image processor makes the pixels) and
decodes greedily with mlx_vlm.generate.generate_step for max_tokens tokens,
past any end-of-sequence token; with "embeddings", also the input embeddings
its text model's first layer reads (mlx-vlm's merged embeddings times the
embedding scale, as Gemma3Model applies it). Writes
    {"cases": [{"prompt": [ids], "ids": [ids], "embeddings": [..] (tokens, hidden)}, ..]}
"""
import contextlib
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image

from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load, prepare_inputs

from vision_reference import convert


def write_image(spec):
    h, w = spec["height"], spec["width"]
    along = np.arange(h)[:, None, None] / (h - 1) if spec["vertical"] else np.arange(w)[None, :, None] / (w - 1)
    start, end = np.array(spec["from"], np.float64), np.array(spec["to"], np.float64)
    noise = np.random.default_rng(spec["seed"]).normal(0.0, 12.0, size=(h, w, 3))
    pixels = start * (1 - along) + end * along + noise
    Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8), "RGB").save(spec["path"], format="PNG")


def main():
    request = json.load(sys.stdin)
    loaded = {}
    with contextlib.redirect_stdout(sys.stderr):
        for spec in request["images"]:
            write_image(spec)
        for spec in request.get("convert", []):
            convert(Path(request["model"]), spec)
    answers = []
    for case in request["cases"]:
        path = case.get("model", request["model"])
        if path not in loaded:
            with contextlib.redirect_stdout(sys.stderr):
                loaded[path] = load(path)
        model, processor = loaded[path]
        tokenizer = processor.tokenizer
        # The soft tokens are divided by sqrt(hidden_size) of the top level:
        # the fixture states the text model's (see the native-mlx README).
        assert model.config.hidden_size == model.config.text_config.hidden_size
        prompt = tokenizer.apply_chat_template(case["messages"], tokenize=False,
                                               add_generation_prompt=True)
        images = case["images"] or None
        inputs = prepare_inputs(processor, images=images, prompts=prompt,
                                image_token_index=model.config.image_token_index,
                                add_special_tokens=False)
        pixels = inputs.get("pixel_values") if images else None
        ids = []
        steps = generate_step(inputs["input_ids"], model, pixels, inputs["attention_mask"],
                              max_tokens=case["max_tokens"], temperature=0.0)
        for (token, _), _ in zip(steps, range(case["max_tokens"])):
            ids.append(int(token))
        answer = {"prompt": inputs["input_ids"][0].tolist(), "ids": ids}
        if case.get("embeddings"):
            merged = model.get_input_embeddings(inputs["input_ids"], pixels,
                                                mask=inputs["attention_mask"]).inputs_embeds
            hidden = model.config.text_config.hidden_size
            scaled = merged * mx.array(hidden**0.5, mx.bfloat16).astype(merged.dtype)
            answer["embeddings"] = scaled[0].astype(mx.float32).reshape(-1).tolist()
        answers.append(answer)
        mx.clear_cache()
    json.dump({"cases": answers}, sys.stdout)


if __name__ == "__main__":
    main()
