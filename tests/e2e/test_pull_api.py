"""End-to-end: pulls over the API (`POST /api/models/pull`, its status,
server-sent events and `DELETE`) against tests/stand-ins/hub_server.py,
with one `hangar serve` whose HF_ENDPOINT is the stand-in and whose
HF_HUB_CACHE is a folder of its own (not a model dir: the catalog reads
it by itself, from the first pull on and after a restart).

The tests share the host and run in order: refusals first (nothing
fetched), then a pull slowed by the stand-in's throttle, cancelled midway
while another model answers a chat, then pulled again (resuming the
partial file) and served.
"""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from conftest import Server, http, wait_until
from test_admin import browser  # noqa: F401  (the headless Chromium fixture)
from test_pull import Hub, repos  # noqa: F401  (the module fixture of the stand-in's repositories)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def hub(repos):  # noqa: F811
    hub = Hub(repos, "--gated", "org/gated", "--token", "hf_secret")
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def host(env, hub, tmp_path_factory):
    root = tmp_path_factory.mktemp("pull-api")
    cache = root / "hub"
    proc_env = dict(env["proc_env"], HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache))
    proc_env.pop("HF_TOKEN", None)
    args = list(env["base_args"])
    (root / "state").mkdir()
    args[args.index("--state-dir") + 1] = str(root / "state")
    srv = Server("hangar (pull api)", args, proc_env)
    srv.cache = cache
    srv.proc_env = proc_env
    yield srv
    assert srv.stop() == []


def api(host, path, method="GET", body=None, timeout=120):
    return http(host.url + path, method, body, timeout=timeout)


def events_of(host, pull_id: str, timeout: float = 120) -> list[dict]:
    """The pull's server-sent events, until the stream ends."""
    got = []
    with urllib.request.urlopen(host.url + f"/api/models/pulls/{pull_id}/events", timeout=timeout) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("data:"):
                got.append(json.loads(line[len("data:"):]))
    return got


def blobs(host, repo: str) -> Path:
    return host.cache / ("models--" + repo.replace("/", "--")) / "blobs"


def test_a_bad_body_is_a_400_naming_the_field(host):
    for body, field in [({}, "repo"), ({"repo": "a/b/c"}, "repo"), ({"repo": 7}, "repo"),
                        ({"repo": "org/tiny", "revision": "../x"}, "revision"),
                        ({"repo": "org/tiny", "include": "*.json"}, "include"),
                        ({"repo": "org/tiny", "include": ["a["]}, "include"),
                        ({"repo": "org/tiny", "force": "yes"}, "force"),
                        # A field a pull does not take is named as sent.
                        ({"repo": "org/tiny", "mirror": "https://x"}, "mirror")]:
        status, answer = api(host, "/api/models/pull", "POST", body)
        assert status == 400 and answer["error"]["param"] == field, (body, answer)
    status, answer = api(host, "/api/models/pull", "POST", b"not json")
    assert status == 400 and "not JSON" in answer["error"]["message"], answer
    status, answer = api(host, "/api/models/pulls/pull-999")
    assert status == 404 and "no pull 'pull-999'" in answer["error"]["message"], answer
    status, answer = api(host, "/api/models/pulls/pull-999", "DELETE")
    assert status == 404, answer


def test_hub_refusals_say_what_to_do(host, hub):
    status, answer = api(host, "/api/models/pull", "POST", {"repo": "org/gated"})
    assert status == 401 and "set HF_TOKEN" in answer["error"]["message"], answer
    status, answer = api(host, "/api/models/pull", "POST", {"repo": "org/missing"})
    assert status == 404 and "org/missing" in answer["error"]["message"], answer
    status, answer = api(host, "/api/models/pull", "POST", {"repo": "org/tiny", "include": ["*.gguf"]})
    assert status == 400 and answer["error"]["param"] == "include", answer
    assert hub.served() == {}


def test_an_unservable_repo_is_a_422_and_nothing_is_fetched(host, hub):
    status, answer = api(host, "/api/models/pull", "POST", {"repo": "org/onnx"})
    assert status == 422 and "no installed plugin can serve it" in answer["error"]["message"], answer
    assert '"force": true' in answer["error"]["message"], answer
    assert "model.onnx" not in hub.served()
    assert not (host.cache / "models--org--onnx").exists()


def test_a_cancelled_pull_keeps_its_part_and_the_next_one_resumes_it(host, hub):
    http(hub.url + "/_throttle?bps=40000")
    status, started = api(host, "/api/models/pull", "POST", {"repo": "org/tiny"})
    assert status == 202 and started["state"] in ("queued", "running"), started
    assert started["engine"] == "mlx-lm" and started["format"] == "mlx", started
    pull_id = started["id"]
    assert wait_until(lambda: list(blobs(host, "org/tiny").glob("*.incomplete")), 30)
    # A second pull of the same repository waits for this one.
    status, answer = api(host, "/api/models/pull", "POST", {"repo": "org/tiny"})
    assert status == 409 and pull_id in answer["error"]["message"], answer

    # Serving another model is not blocked by the pull.
    status, answer = api(host, "/v1/chat/completions", "POST", {"model": "tiny-llama", **CHAT})
    assert status == 200, answer
    status, now = api(host, f"/api/models/pulls/{pull_id}")
    assert status == 200 and now["state"] == "running", now
    assert 0 < now["bytes_done"] < now["bytes_total"], now

    status, ended = api(host, f"/api/models/pulls/{pull_id}", "DELETE")
    assert status == 200 and ended["state"] == "cancelled" and ended["ended_at"], ended
    [partial] = list(blobs(host, "org/tiny").glob("*.incomplete"))
    kept = partial.stat().st_size
    assert kept > 0
    status, models = api(host, "/api/models/rescan", "POST")
    assert "org/tiny" not in [m["model"]["id"] for m in models["models"]], models
    status, listed = api(host, "/v1/models")
    assert "org/tiny" not in [m["id"] for m in listed["data"]], listed
    # Its stream replays what happened and ends with the cancel.
    kinds = [e["event"] for e in events_of(host, pull_id)]
    assert kinds[0] == "plan" and kinds[-1] == "cancelled", kinds

    # Again, at full speed: it continues the partial file.
    http(hub.url + "/_throttle?bps=0")
    status, again = api(host, "/api/models/pull", "POST", {"repo": "org/tiny"})
    assert status == 202 and again["id"] != pull_id, again
    events = events_of(host, again["id"])
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan" and kinds[-1] == "done", kinds
    assert kinds.count("file") == len(events[0]["files"]), kinds
    assert events[-1]["model"] == "org/tiny", events[-1]
    size = next(f["size"] for f in events[0]["files"] if f["path"] == "model.safetensors")
    # (The stand-in's count is no measure here: the cancelled request's
    # thread may still write into its closed connection.)
    [weights] = [e for e in events if e["event"] == "file" and e["path"] == "model.safetensors"]
    assert weights["fetched"] == size - kept, (weights, size, kept)
    assert any(f"range=bytes={kept}-" in r for r in http(hub.url + "/_stats")[1]["requests"])
    status, done = api(host, f"/api/models/pulls/{again['id']}")
    assert done["state"] == "done" and done["bytes_done"] == done["bytes_total"], done
    assert all(f["done"] for f in done["files"]), done
    assert not list(blobs(host, "org/tiny").glob("*.incomplete"))

    status, listed = api(host, "/v1/models")
    assert "org/tiny" in [m["id"] for m in listed["data"]], listed
    status, answer = api(host, "/v1/chat/completions", "POST", {"model": "org/tiny", **CHAT})
    assert status == 200, answer

    status, pulls = api(host, "/api/models/pulls")
    states = {p["id"]: p["state"] for p in pulls["pulls"]}
    assert states[pull_id] == "cancelled" and states[again["id"]] == "done", states
    status, log = api(host, "/api/events")
    kinds = [e["kind"] for e in log["events"] if e["model"] == "org/tiny"]
    assert kinds[:4] == ["pull_started", "pull_cancelled", "pull_started", "pull_done"], kinds


def test_a_pulled_model_is_served_after_a_restart(host, tmp_path):
    """The cache is no model dir here: a host started afresh reads it by
    itself, as it reads it by default."""
    args = list(host.args)
    (tmp_path / "state").mkdir()
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")
    again = Server("hangar (pull api, restarted)", args, host.proc_env)
    try:
        status, listed = http(again.url + "/v1/models")
        assert status == 200 and "org/tiny" in [m["id"] for m in listed["data"]], listed
        status, answer = http(again.url + "/v1/chat/completions", "POST", {"model": "org/tiny", **CHAT})
        assert status == 200, answer
        status, models = http(again.url + "/api/models")
        [tiny] = [m for m in models["models"] if m["model"]["id"] == "org/tiny"]
        assert tiny["source"] == "hf_cache", tiny
    finally:
        assert again.stop() == []


def test_the_hub_is_searched_and_a_repository_shown_before_a_pull(host, hub):
    status, found = api(host, "/api/hub/models?search=TIN")
    assert status == 200 and found["endpoint"] == hub.url, found
    assert [m["id"] for m in found["models"]] == ["org/tiny"], found
    status, found = api(host, "/api/hub/models?search=nothing-like-it")
    assert status == 200 and found["models"] == [], found
    status, answer = api(host, "/api/hub/models?search=x&page=2")
    assert status == 400 and "page" in answer["error"]["message"], answer

    status, shown = api(host, "/api/hub/models/org/onnx")
    assert status == 200 and shown["engine"] is None and shown["format"] is None, shown
    assert {f["path"]: f["size"] for f in shown["files"]} == {"config.json": 22, "model.onnx": 300_000}, shown
    assert "no recognition rule matches" in shown["reason"], shown
    # Pulled by the test before: every file is in the cache.
    status, shown = api(host, "/api/hub/models/org/tiny")
    assert status == 200 and shown["engine"] == "mlx-lm" and shown["to_fetch"] == 0, shown
    assert all(f["cached"] for f in shown["files"]), shown
    status, answer = api(host, "/api/hub/models/org/tiny?revision=../x")
    assert status == 400 and answer["error"]["param"] == "revision", answer
    status, answer = api(host, "/api/hub/models/org/gated")
    assert status == 401 and "set HF_TOKEN" in answer["error"]["message"], answer
    status, answer = api(host, "/api/hub/models/org/missing")
    assert status == 404, answer
    assert "model.onnx" not in hub.served()


def test_the_admin_page_browses_pulls_and_cancels(host, hub, browser):
    from test_admin import console_errors, css, click, text, wait

    b = browser
    b.get(host.url + "/admin")
    wait("the page to start", lambda: "host" in text(b, "#status"))
    css(b, "#browse-search").send_keys("o")
    click(b, "#browse-form button[type=submit]")
    wait("the search results", lambda: css(b, "#browse-results tr[data-repo='org/tiny']"))
    assert hub.url in text(b, "#browse-hub")

    # A servable repository: its files and engine, then a pull to the end.
    click(b, "#browse-results tr[data-repo='org/tiny'] button.show")
    detail = wait("the detail", lambda: css(b, "#browse-detail div[data-repo='org/tiny']"))
    assert "served by mlx-lm" in detail.text and "model.safetensors" in detail.text, detail.text
    click(b, "#browse-detail button.pull")
    wait("the pull to finish", lambda: css(b, "#pulls-body tr:last-child td.state").text == "done")
    bar = css(b, "#pulls-body tr:last-child progress")
    assert bar.get_attribute("value") == bar.get_attribute("max"), bar.get_attribute("outerHTML")

    # An unservable one needs force; throttled, it is cancelled midway.
    http(hub.url + "/_throttle?bps=20000")
    try:
        click(b, "#browse-results tr[data-repo='org/onnx'] button.show")
        detail = wait("the onnx detail", lambda: css(b, "#browse-detail div[data-repo='org/onnx']"))
        assert "no installed plugin serves it" in detail.text, detail.text
        click(b, "#browse-detail input.force")
        click(b, "#browse-detail button.pull")
        wait("the onnx pull to run", lambda: css(b, "#pulls-body tr:last-child td.state").text == "running")
        click(b, "#pulls-body tr:last-child button.cancel")
        wait("the cancel", lambda: css(b, "#pulls-body tr:last-child td.state").text == "cancelled")
    finally:
        http(hub.url + "/_throttle?bps=0")
    assert console_errors(b) == []
