"""`POST /v1/messages` end to end on mlx-lm (the main server): the official
`anthropic` client, streaming and not, stop sequences, errors in
Anthropic's shape with the right statuses, and `x-api-key`. native-mlx and
llama-server run the same checks in their own modules.
"""
from __future__ import annotations

import anthropic
import pytest

from anthropic_checks import USER, client, exercise
from conftest import Server, http

LLAMA = "tiny-llama"


def test_messages_streaming_and_not_on_mlx_lm(server):
    exercise(server.url, LLAMA)
    # Counted like the OpenAI routes, under their own route.
    status, text = http(server.url + "/metrics")
    assert status == 200
    line = f'hangar_requests_total{{model="{LLAMA}",route="/v1/messages",status="200"}}'
    assert line in text, [l for l in text.splitlines() if "requests_total" in l]


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(anthropic.APIStatusError) as e:
        call()
    return e.value.status_code, e.value.body


def test_messages_errors_in_anthropics_shape(server):
    c = client(server.url)
    good = dict(model=LLAMA, max_tokens=4, messages=USER)

    def bad(**change):
        return error_of(lambda: c.messages.create(**{**good, **change}))

    cases = [
        (dict(max_tokens=0), 400, "invalid_request_error", "'max_tokens' must be a whole number"),
        (dict(extra_body={"temperature": 1.5}), 400, "invalid_request_error", "'temperature' must be a number from 0 to 1"),
        (dict(stop_sequences=[""]), 400, "invalid_request_error", "'stop_sequences[0]'"),
        (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "ftp://x"}}]}]),
         400, "invalid_request_error", "'messages[0].content[0].source' must be a data: URL such as data:image/png;base64,..., or a file: or http(s) URL"),
        # An inline image reaches the model check: this model takes text only.
        (dict(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
            {"type": "text", "text": "what is this?"}]}]),
         400, "invalid_request_error", "takes text only: it has no vision tower"),
        (dict(model="no-such-model"), 404, "not_found_error", "model 'no-such-model' does not exist"),
    ]
    for change, status, kind, words in cases:
        got_status, body = bad(**change)
        assert got_status == status, (change, got_status, body)
        assert body["type"] == "error" and body["error"]["type"] == kind, (change, body)
        assert words in body["error"]["message"], (change, body)

    # Raw (the client refuses to send these): no max_tokens, a body that is
    # not JSON, a field this host does not serve (a thinking budget).
    status, body = http(server.url + "/v1/messages", "POST", {"model": LLAMA, "messages": USER})
    assert status == 400 and "'max_tokens' is required" in body["error"]["message"], body
    status, body = http(server.url + "/v1/messages", "POST", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    status, body = http(server.url + "/v1/messages", "POST",
                        {**good, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert status == 400 and "'thinking' is not supported" in body["error"]["message"], body


def test_messages_take_x_api_key_or_bearer(env):
    srv = Server("hangar --api-key (messages)", env["base_args"] + ["--api-key", "secret"], env["proc_env"])
    try:
        status, body = error_of(lambda: client(srv.url, key="wrong").messages.create(
            model=LLAMA, max_tokens=4, messages=USER))
        assert status == 401 and body["error"]["type"] == "authentication_error", body
        assert "x-api-key" in body["error"]["message"], body
        # Past the key check, a request without max_tokens is the client's
        # mistake (400), not a 401: no model needs loading to tell.
        request = {"model": LLAMA, "messages": USER}
        headers = {"anthropic-version": "2023-06-01"}
        for key in ({"x-api-key": "secret"}, {"Authorization": "Bearer secret"}):
            status, body = http(srv.url + "/v1/messages", "POST", request, {**headers, **key})
            assert status == 400 and "'max_tokens' is required" in body["error"]["message"], (key, body)
        status, body = http(srv.url + "/v1/messages", "POST", request, {"x-api-key": "wrong"})
        assert status == 401 and body["type"] == "error", body
    finally:
        problems = srv.stop()
    assert not problems, problems
