"""native-mlx end to end: the in-process MLX engine in Rust, selected by
resolution on this CPU machine (it outranks mlx-lm), hosted in a `hangar
worker` child process, driven by the official openai client: chat and
completions streaming and not, greedy parity with mlx-lm through the same
API, a client that hangs up stops generation, and a worker crash is cleaned
up like any engine crash.
"""
from __future__ import annotations

import base64
import os
import signal
import time

import openai
import pytest

from anthropic_checks import exercise
from conftest import REPO, Server, http, pid_is_gone, proc_start_time, wait_until

LLAMA, QWEN = "tiny-llama", "tiny-qwen"
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture(scope="module")
def native(env, tmp_path_factory):
    if not (env["plugins_dir"] and os.path.isdir(os.path.join(env["plugins_dir"], "native-mlx"))):
        pytest.fail("target/plugins/native-mlx was not built: run scripts/build-plugins.sh")
    tmp = tmp_path_factory.mktemp("native")
    config = tmp / "config.toml"
    config.write_text(f'[plugins.mlx-lm]\nprogram = "{env["python"]}"\nallow_programs = ["python3"]\n')
    args = list(env["base_args"])
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp / "state")
    srv = Server("hangar (native-mlx)", args, env["proc_env"])
    yield srv
    problems = srv.stop()
    assert not problems, problems


def api(srv, path, method="GET", body=None):
    return http(srv.url + path, method, body)


def session_of(srv, model):
    return next((s for s in api(srv, "/api/sessions")[1]["sessions"] if s["model"] == model), None)


def test_resolution_picks_native_mlx_and_it_serves(native):
    status, body = api(native, f"/api/resolve?model={LLAMA}")
    assert body["resolution"]["chosen"] == "native-mlx", body
    client = openai.OpenAI(base_url=native.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=8)
    assert r.model == LLAMA and r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(
        model=LLAMA, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content[: len(text)] and chunks[-1].usage.completion_tokens == 6
    c = client.completions.create(model=QWEN, prompt="Once upon a time", max_tokens=5)
    assert c.usage.completion_tokens == 5 and isinstance(c.choices[0].text, str)
    session = session_of(native, LLAMA)
    assert session["plugin"] == "native-mlx" and session["pid"], session


def test_greedy_output_matches_mlx_lm_through_the_same_api(native, client):
    # `client` talks to the main server, where mlx-lm is the default engine.
    # (Token-level parity for every family is native-mlx's own test suite;
    # here the whole path: template, engine, detokenizer, API. tiny-qwen is
    # left out: its random weights emit byte 0x00, which mlx-lm's streaming
    # detokenizer shows as the byte-level symbol 'Ā' and the tokenizers
    # library decodes to the byte itself.)
    ours = openai.OpenAI(base_url=native.url + "/v1", api_key="x", max_retries=0)
    for model in (LLAMA,):
        a = ours.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
        b = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
        assert a.choices[0].message.content == b.choices[0].message.content, (model, a, b)
        assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_a_client_that_hangs_up_stops_generation(native):
    client = openai.OpenAI(base_url=native.url + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=100000, stream=True)
    it = iter(stream)
    next(it), next(it)
    stream.close()
    session = session_of(native, LLAMA)
    logs = f"/api/sessions/{session['id']}/logs"
    assert wait_until(lambda: "generation cancelled by the client" in str(api(native, logs)[1]["lines"]), 10), (
        api(native, logs)[1]["lines"][-5:])
    assert wait_until(lambda: session_of(native, LLAMA)["in_flight"] == 0, 5)


def test_a_crashed_worker_is_cleaned_up_like_any_engine(native):
    client = openai.OpenAI(base_url=native.url + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=100000, stream=True)
    it = iter(stream)
    next(it)
    pid = session_of(native, LLAMA)["pid"]
    start = proc_start_time(pid)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as e:
        for _ in it:
            pass
    assert "exited" in e.value.message, e.value.message
    assert wait_until(lambda: session_of(native, LLAMA) is None, 1.0)
    assert wait_until(lambda: pid_is_gone(pid, start), 1.0)
    r = client.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=2)
    assert r.usage.completion_tokens == 2
    assert session_of(native, LLAMA)["pid"] != pid


def test_anthropic_messages_on_native_mlx(native):
    exercise(native.url, LLAMA)


def test_a_long_prompt_is_served_from_the_prefix_cache_and_from_disk_after_a_restart(env, tmp_path):
    # A host of its own, restarted on the same state dir: the disk tier
    # lives in the folder the host gives the plugin (LoadRequest.cache_dir,
    # <state>/cache/native-mlx), which outlives sessions and the host.
    config = tmp_path / "config.toml"
    config.write_text(f'[plugins.mlx-lm]\nprogram = "{env["python"]}"\nallow_programs = ["python3"]\n')
    args = list(env["base_args"])
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")
    prompt = " ".join(f"w{i}" for i in range(400))
    blocks = tmp_path / "state" / "cache" / "native-mlx" / "prefix"

    def cached(srv):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model=LLAMA, prompt=prompt, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens >= 256, r.usage
        details = r.usage.prompt_tokens_details
        return r.usage.prompt_tokens, (details.cached_tokens if details else 0)

    srv = Server("hangar (native-mlx, prefix cache)", args, env["proc_env"])
    try:
        prompt_tokens, cold = cached(srv)
        assert cold == 0
        _, warm = cached(srv)
        # Whole 128-token blocks, short of the last token (which must be computed).
        assert 128 <= warm < prompt_tokens and warm % 128 == 0, (warm, prompt_tokens)
        # Blocks reach the disk off the engine thread.
        assert wait_until(lambda: len(list(blocks.rglob("*.kv"))) >= warm // 128, 10), list(blocks.rglob("*"))
    finally:
        assert not srv.stop()
    srv = Server("hangar (native-mlx, prefix cache, restarted)", args, env["proc_env"])
    try:
        _, from_disk = cached(srv)
        assert from_disk == warm
    finally:
        assert not srv.stop()


VLM = "tiny-gemma3-vision"


def test_a_gemma3_vision_model_answers_about_images_from_every_client(env, tmp_path):
    """A Gemma 3 folder with a vision tower (random weights) is listed as a
    vision model and served by native-mlx: an image, inline or named by a
    file URL, reaches the model as its soft tokens; the OpenAI, Anthropic
    and Ollama clients' images give the same greedy answer; the prefix
    cache serves a repeated image and not another one."""
    import anthropic
    import ollama

    from conftest import _run, png

    models = tmp_path / "models"
    models.mkdir()
    _run([env["python"], str(REPO / "scripts" / "make_tiny_model.py"), str(models / VLM),
          "--arch", "gemma3", "--vision", "--layers", "3", "--hidden", "128", "--heads", "8",
          "--window", "32", "--image-size", "64", "--patch-size", "4", "--mm-tokens", "64"],
         "make_tiny_model.py --arch gemma3 --vision")
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    image, other = png(16, 16, blue=40), png(16, 16, blue=220)
    (pictures / "image.png").write_bytes(image)
    config = tmp_path / "config.toml"
    config.write_text(f'[images]\nlocal_dirs = ["{pictures}"]\n')
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")
    # Long enough that whole 128-token blocks precede the image.
    question = "Look at the picture and describe it. " * 30
    data_url = lambda b: "data:image/png;base64," + base64.b64encode(b).decode()  # noqa: E731

    srv = Server("hangar (native-mlx, vision)", args, env["proc_env"])
    try:
        row = next(m["model"] for m in api(srv, "/api/models")[1]["models"] if m["model"]["id"] == VLM)
        assert row.get("vision") is True and row["model_type"] == "gemma3", row
        assert api(srv, f"/api/resolve?model={VLM}")[1]["resolution"]["chosen"] == "native-mlx"
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)

        def ask(url, text=question, **kw):
            content = [{"type": "text", "text": text}]
            if url:
                content.append({"type": "image_url", "image_url": {"url": url}})
            return c.chat.completions.create(model=VLM, max_tokens=8, temperature=0,
                                             messages=[{"role": "user", "content": content}], **kw)

        def cached(r):
            details = r.usage.prompt_tokens_details
            return details.cached_tokens if details else 0

        blind = ask(None)
        seen = ask(data_url(image))
        # 64 soft tokens and the image's markers around them.
        assert seen.usage.prompt_tokens >= blind.usage.prompt_tokens + 64, (seen.usage, blind.usage)
        again = ask(data_url(image))
        assert again.choices[0].message.content == seen.choices[0].message.content
        # The repeat reads the image's blocks from the cache; another image
        # shares only the text before it.
        assert cached(again) > cached(blind) and cached(again) >= 128, (again.usage, blind.usage)
        different = ask(data_url(other))
        assert 0 < cached(different) < cached(again), (different.usage, again.usage)
        # Named by a file URL: the host reads it, the engine sees the bytes.
        by_file = ask(f"file://{pictures / 'image.png'}")
        assert by_file.choices[0].message.content == seen.choices[0].message.content
        streamed = "".join(
            ch.choices[0].delta.content or "" for ch in ask(data_url(image), stream=True) if ch.choices)
        assert streamed == seen.choices[0].message.content
        m = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0).messages.create(
            model=VLM, max_tokens=8, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
                {"type": "text", "text": question},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(image).decode()}}]}])
        assert m.content[0].text == seen.choices[0].message.content, m
        o = ollama.Client(host=srv.url + "/ollama").chat(
            model=VLM, messages=[{"role": "user", "content": question, "images": [image]}],
            options={"num_predict": 8, "temperature": 0}, stream=False)
        assert o.message.content == seen.choices[0].message.content, o
        # Bytes that are no image are the client's 400, naming the part.
        with pytest.raises(openai.BadRequestError) as e:
            ask("data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode())
        assert "image" in e.value.body["message"], e.value.body
    finally:
        assert not srv.stop()
