"""Reference pixel values and image soft tokens for the engine's vision tests, from transformers and mlx-vlm.

Reads one JSON request from stdin:
    {"model": DIR, "images": [{"path": FILE, "mode": "RGB" | "L" | "RGBA" | "LA" | "P",
                               "width": W, "height": H, "seed": S, "format": "PNG" | "JPEG"}, ..]}
writes each image (seeded noise, smoothed so that resizing has something to
average; RGBA's alpha spans 0 to 255) to its path with Pillow, then preprocesses
the file as mlx-vlm does (transformers' AutoImageProcessor with use_fast=False:
Gemma3ImageProcessorPil) and runs mlx-vlm's gemma3 vision tower and projector
(mlx_vlm.utils.load_model of DIR) on the pixels. Writes
    {"images": [{"pixels": [..] (height, width, channel), "features": [..] (tokens, hidden),
                 "tokens": T, "hidden": D}, ..]}
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image
from transformers import AutoImageProcessor

from mlx_vlm.utils import load_model


def write_image(spec):
    rng = np.random.default_rng(spec["seed"])
    channels = {"RGB": 3, "L": 1, "RGBA": 4, "LA": 2, "P": 1}[spec["mode"]]
    h, w = spec["height"], spec["width"]
    noise = rng.integers(0, 256, size=(h + 2, w + 2, channels)).astype(np.float64)
    # A 3x3 box blur: neighbouring pixels alike, as in a photograph.
    smooth = sum(noise[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)) / 9
    pixels = np.clip(np.round(smooth), 0, 255).astype(np.uint8)
    if spec["mode"] in ("RGBA", "LA"):
        pixels[..., -1] = rng.integers(0, 256, size=(h, w)).astype(np.uint8)
        pixels[0, 0, -1], pixels[0, 1, -1] = 0, 255
    if channels == 1:
        image = Image.fromarray(pixels[..., 0], "L")
        if spec["mode"] == "P":
            image = image.quantize(16)
    else:
        image = Image.fromarray(pixels, spec["mode"])
    image.save(spec["path"], format=spec.get("format", "PNG"), **({"quality": 90} if spec.get("format") == "JPEG" else {}))


def main():
    request = json.load(sys.stdin)
    model_dir = Path(request["model"])
    processor = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    model = load_model(model_dir)
    embed = model.language_model.model.embed_tokens
    dtype = getattr(embed, "scales", embed.weight).dtype
    answers = []
    for spec in request["images"]:
        write_image(spec)
        with Image.open(spec["path"]) as image:
            pixels = processor(images=[image], return_tensors="np")["pixel_values"]
        # As mlx-vlm's Gemma 3 get_input_embeddings: channels last, the text
        # embeddings' type, the tower's post-LN states into the projector.
        hidden, _, _ = model.vision_tower(mx.array(pixels).transpose(0, 2, 3, 1).astype(dtype),
                                          output_hidden_states=True)
        features = model.multi_modal_projector(hidden).astype(mx.float32)
        mx.eval(features)
        f = np.array(features)[0]
        answers.append({
            "pixels": pixels[0].transpose(1, 2, 0).reshape(-1).tolist(),
            "features": f.reshape(-1).tolist(),
            "tokens": f.shape[0],
            "hidden": f.shape[1],
        })
    json.dump({"images": answers}, sys.stdout)


if __name__ == "__main__":
    main()
