"""Reference prompts and greedy answers for the engine's vision-language tests, from mlx-vlm.

Reads one JSON request from stdin:
    {"model": DIR,
     "images": [{"path": FILE, "width": W, "height": H, "from": [R, G, B], "to": [R, G, B],
                 "vertical": BOOL, "seed": S}, ..],
     "cases": [{"messages": [..], "images": [FILE, ..], "max_tokens": N,
                "embeddings": BOOL}, ..]}
writes each image as an RGB PNG (RGB: mlx-vlm's loader drops an alpha
channel where transformers' processor composites it on white): a colour
gradient from "from" to "to", down or across, with seeded noise. Gradients,
not noise alone: the tiny model's answer then depends on which image it
sees and on the order of an image's soft tokens (the means of two noise
images are all but the same). Then for each case it renders the messages
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

import mlx.core as mx
import numpy as np
from PIL import Image

from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load, prepare_inputs


def write_image(spec):
    h, w = spec["height"], spec["width"]
    along = np.arange(h)[:, None, None] / (h - 1) if spec["vertical"] else np.arange(w)[None, :, None] / (w - 1)
    start, end = np.array(spec["from"], np.float64), np.array(spec["to"], np.float64)
    noise = np.random.default_rng(spec["seed"]).normal(0.0, 12.0, size=(h, w, 3))
    pixels = start * (1 - along) + end * along + noise
    Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8), "RGB").save(spec["path"], format="PNG")


def main():
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        for spec in request["images"]:
            write_image(spec)
        model, processor = load(request["model"])
    tokenizer = processor.tokenizer
    # The soft tokens are divided by sqrt(hidden_size) of the top level:
    # the fixture states the text model's (see the native-mlx README).
    assert model.config.hidden_size == model.config.text_config.hidden_size
    answers = []
    for case in request["cases"]:
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
