"""Reference pixel values and image soft tokens for the engine's vision tests, from transformers and mlx-vlm.

Reads one JSON request from stdin:
    {"model": DIR, "images": [{"path": FILE, "mode": "RGB" | "L" | "RGBA" | "LA" | "P",
                               "width": W, "height": H, "seed": S, "format": "PNG" | "JPEG"}, ..],
     "convert": [{"mlx_path": DIR, "bits": B, "vision": BOOL}, ..], "also": [DIR, ..]}
writes each image (seeded noise, smoothed so that resizing has something to
average; RGBA's alpha spans 0 to 255) to its path with Pillow, then preprocesses
the file as mlx-vlm does (transformers' AutoImageProcessor with use_fast=False:
Gemma3ImageProcessorPil) and runs mlx-vlm's gemma3 vision tower and projector
(mlx_vlm.utils.load_model of DIR) on the pixels. Each "convert" entry writes DIR
as mlx_vlm.convert writes it quantized to B bits (weights and config.json; the
processor files are copied, since the tiny tokenizer has no Gemma 3 special
tokens for mlx-vlm's processor): its default predicate keeps the vision tower
and projector dense; "vision" quantizes the tower's linear layers as well.
Writes
    {"images": [{"pixels": [..] (height, width, channel), "features": [..] (tokens, hidden),
                 "tokens": T, "hidden": D}, ..],
     "converted": [[features of each image] for each convert entry, then each "also" folder]}
"""
import contextlib
import shutil
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image
from transformers import AutoImageProcessor

import mlx.nn as nn
from mlx_vlm.quant_utils import quantize_model
from mlx_vlm.utils import load_model, save_config, save_weights, skip_multimodal_module


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


def convert(hf_path, spec):
    """mlx_vlm.convert's quantization and files, without its processor."""
    model = load_model(hf_path, lazy=True)
    with open(hf_path / "config.json") as f:
        config = json.load(f)
    if spec["vision"]:
        predicate = lambda path, module: isinstance(module, nn.Linear) or not skip_multimodal_module(path)
    else:
        predicate = lambda path, module: not skip_multimodal_module(path)
    model, config = quantize_model(model, config, 64, spec["bits"], mode="affine", quant_predicate=predicate)
    out = Path(spec["mlx_path"])
    save_weights(out, model, donate_weights=True)
    for file in hf_path.glob("*.json"):
        shutil.copy(file, out)
    save_config(config, config_path=out / "config.json")


def features_of(model, pixels):
    """As mlx-vlm's Gemma 3 get_input_embeddings: channels last, the text
    embeddings' type, the tower's post-LN states into the projector."""
    embed = model.language_model.model.embed_tokens
    dtype = (embed.scales if hasattr(embed, "scales") else embed.weight).dtype
    hidden, _, _ = model.vision_tower(mx.array(pixels).transpose(0, 2, 3, 1).astype(dtype),
                                      output_hidden_states=True)
    features = model.multi_modal_projector(hidden).astype(mx.float32)
    mx.eval(features)
    return np.array(features)[0]


def main():
    request = json.load(sys.stdin)
    model_dir = Path(request["model"])
    # mlx-vlm reports its progress on stdout, which carries the answer.
    with contextlib.redirect_stdout(sys.stderr):
        for spec in request.get("convert", []):
            convert(model_dir, spec)
    processor = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    model = load_model(model_dir)
    others = [spec["mlx_path"] for spec in request.get("convert", [])] + request.get("also", [])
    converted = [load_model(Path(path)) for path in others]
    answers, others = [], [[] for _ in converted]
    for spec in request["images"]:
        write_image(spec)
        with Image.open(spec["path"]) as image:
            pixels = processor(images=[image], return_tensors="np")["pixel_values"]
        f = features_of(model, pixels)
        answers.append({
            "pixels": pixels[0].transpose(1, 2, 0).reshape(-1).tolist(),
            "features": f.reshape(-1).tolist(),
            "tokens": f.shape[0],
            "hidden": f.shape[1],
        })
        for other, m in zip(others, converted):
            other.append(features_of(m, pixels).reshape(-1).tolist())
    json.dump({"images": answers, "converted": others}, sys.stdout)


if __name__ == "__main__":
    main()
