"""End-to-end: a third-party plugin for an engine and a model format that
are not in this repo, made from `hangar plugin new`'s template.

The engine is tests/stand-ins/toy_server.py (`toy-server`), the format is
`.toy` (a text file whose reply the engine gives). The test edits the
template as an author would (the format's name, a recognition rule, a
conformance fixture), then checks that the plugin passes `hangar plugin
check` (its fixture recognised and served), packs and installs, that
`hangar resolve` recognises a `.toy` file by the plugin's rule, and that
`hangar serve` serves it to the official openai client, streamed and not.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import openai

from conftest import HANGAR, REPO, Server, _run, http

REPLY = "Hello from the toy engine, one word per token"
RULES = '''
[[recognize]]
format = "toy"
file = "*.toy"

[[recognize]]
format = "toy"
folder = ["*.toy"]

[conformance]
fixture = "fixtures/hello.toy"
'''


def hangar(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    r = subprocess.run([str(HANGAR), *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    return r.returncode, r.stdout


def test_a_plugin_made_from_the_template_teaches_a_new_format_and_serves_it(tmp_path):
    _run(["cargo", "build", "--quiet", "-p", "hangar"], "cargo build -p hangar")
    home = tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    # This interpreter, not `env python3`: HOME moves, and with it pyenv's.
    script = (REPO / "tests" / "stand-ins" / "toy_server.py").read_text().split("\n", 1)[1]
    (bin_dir / "toy-server").write_text(f"#!{sys.executable}\n{script}")
    (bin_dir / "toy-server").chmod(0o755)
    real_home = Path(os.environ["HOME"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
    env.update(
        HOME=str(home),
        CARGO_HOME=os.environ.get("CARGO_HOME", str(real_home / ".cargo")),
        RUSTUP_HOME=os.environ.get("RUSTUP_HOME", str(real_home / ".rustup")),
        # The workspace's target dir: the SDK and its dependencies are built.
        CARGO_TARGET_DIR=str(REPO / "target"),
        HANGAR_PLATFORM="linux/x86_64/cpu",
        HANGAR_CONFIG=str(tmp_path / "config.toml"),
    )
    (tmp_path / "config.toml").write_text("")

    # The author's part: the template, told about the format.
    work = tmp_path / "work"
    work.mkdir()
    code, out = hangar(["plugin", "new", "--kind", "native", "--sdk-path", str(REPO / "sdk"), str(work / "toy")], env)
    assert code == 0, out
    crate = work / "toy"
    shutil.copy(REPO / "Cargo.lock", crate / "Cargo.lock")
    manifest = (crate / "plugin.toml").read_text()
    manifest = manifest.replace('formats = ["gguf"]', 'formats = ["toy"]')
    (crate / "plugin.toml").write_text(manifest + RULES)
    lib = (crate / "src" / "lib.rs").read_text()
    (crate / "src" / "lib.rs").write_text(lib.replace('formats: ["gguf"]', 'formats: ["toy"]'))
    (crate / "fixtures").mkdir()
    (crate / "fixtures" / "hello.toy").write_text(f"TOY1\n{REPLY}\n")

    code, out = hangar(["--json", "plugin", "check", str(crate), "--debug"], env)
    assert code == 0, out
    checks = {c["name"]: c for c in json.loads(out[out.index("{"):])["checks"]}
    fixture, served = checks["fixture_recognized"], checks["serves_fixture"]
    assert fixture["outcome"] == "pass", fixture
    assert "hello.toy is the toy model 'hello' (rule toy: *.toy (toy)); model_files [hello.toy]" in fixture["verdict"], fixture
    assert served["outcome"] == "pass", served
    assert 'chat answered "Hello from the toy engine, one word per" and streamed 10 chunks ending in [DONE]' in served["verdict"], served
    assert checks["launch_plan_declared_programs"]["outcome"] == "pass", checks

    plugins = tmp_path / "plugins"
    package = tmp_path / "toy.tar.gz"
    code, out = hangar(["plugin", "pack", str(crate), "--debug", "-o", str(package)], env)
    assert code == 0, out
    code, out = hangar(["--plugins-dir", str(plugins), "plugin", "install", "--yes", str(package)], env)
    assert code == 0, out
    code, out = hangar(["--plugins-dir", str(plugins), "plugins"], env)
    assert code == 0 and "toy: recognises toy: *.toy; toy: a folder of *.toy" in out, out

    # The operator's part: a model dir with toy models, and one that is not.
    models = tmp_path / "models"
    (models / "shelf").mkdir(parents=True)
    (models / "hello.toy").write_text(f"TOY1\n{REPLY}\n")
    (models / "shelf" / "model.toy").write_text("TOY1\nA shelf of toys\n")
    (models / "bare").mkdir()
    (models / "notes.txt").write_text("not a model\n")

    code, out = hangar(["--plugins-dir", str(plugins), "resolve", str(models / "hello.toy")], env)
    assert code == 0, out
    assert "model: hello (" in out and "rule toy: *.toy (toy); files: hello.toy)" in out, out
    assert "toy → toy" in out, out
    code, out = hangar(["--plugins-dir", str(plugins), "resolve", str(models / "notes.txt")], env)
    assert code == 1, out
    assert "no rule recognises the file (tried gguf: *.gguf (built-in); toy: *.toy (toy))" in out, out
    code, out = hangar(["--plugins-dir", str(plugins), "resolve", str(models / "bare")], env)
    assert code == 1 and "holds no model files (tried " in out and "toy: a folder of *.toy (toy)" in out, out

    state = tmp_path / "state"
    state.mkdir()
    server = Server("hangar-toy", [
        str(HANGAR), "serve", "--port", "0", "--model-dir", str(models),
        "--plugins-dir", str(plugins), "--state-dir", str(state),
    ], env)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert sorted(m.id for m in client.models.list()) == ["hello", "shelf"]

        status, body = http(server.url + "/api/models")
        assert status == 200, body
        rules = {m["model"]["id"]: (m["model"]["rule"], m["model"]["files"]) for m in body["models"]}
        assert rules == {
            "hello": ("toy: *.toy (toy)", ["hello.toy"]),
            "shelf": ("toy: a folder of *.toy (toy)", ["model.toy"]),
        }, rules
        not_models = {Path(n["path"]).name: n["reason"] for n in body["not_models"]}
        assert list(not_models) == ["bare"] and "toy: a folder of *.toy (toy)" in not_models["bare"], not_models
        status, body = http(server.url + "/api/resolve?model=hello")
        assert status == 200 and body["model"]["rule"] == "toy: *.toy (toy)", body
        assert body["resolution"]["chosen"] == "toy", body
        status, body = http(server.url + "/api/resolve?model=bare")
        assert status == 404 and "holds no model files (tried" in body["error"]["message"], body

        messages = [{"role": "user", "content": "Hi"}]
        answer = client.chat.completions.create(model="hello", messages=messages)
        assert answer.choices[0].message.content == REPLY
        assert answer.choices[0].finish_reason == "stop"
        stream = client.chat.completions.create(model="hello", messages=messages, stream=True, max_tokens=3)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "Hello from the"
        answer = client.chat.completions.create(model="shelf", messages=messages)
        assert answer.choices[0].message.content == "A shelf of toys"
    finally:
        problems = server.stop()
    assert not problems, problems
