"""`POST /v1/responses` (OpenAI's Responses API) end to end through
`hangar serve`, with the official `openai` client: whole and streamed (the
events in the Responses API's order, each parsed by the client's types), a
tool call and its round trip, reasoning, follow-ups by
`previous_response_id`, `GET` and `DELETE /v1/responses/{id}`,
`store: false`, and a client's mistakes as 400s naming the field.

The engine is the SDK's in-process `echo` example (test_tools.py's
fixture): it answers with the words of every message of the chat request
the host made, so an answer shows what the engine was sent (the earlier
turns of a follow-up, the instructions), and a prompt holding a Hermes
`<tool_call>` is an answer that calls a tool. `<|eos|>` ends an answer.
"""
from __future__ import annotations

import json

import openai
import pytest

from conftest import Server, http
from test_tools import CALL, echo, oa  # noqa: F401 (echo is the fixture)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_plain_response(echo):
    c = oa(echo)
    r = c.responses.create(model="plain-echo", input="Hello there <|eos|>", max_output_tokens=32)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed", r
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed", item
    assert item.content[0].type == "output_text" and r.output_text.strip() == "Hello there", r
    assert r.usage.output_tokens == 2 and r.usage.total_tokens == r.usage.input_tokens + 2, r.usage
    assert r.model == "plain-echo" and r.store is True and r.previous_response_id is None, r

    # `instructions` are the system message (the echo says them first);
    # items may be plain {"role", "content"} or typed messages with parts.
    r = c.responses.create(model="plain-echo", instructions="Be brief.",
                           input=[{"role": "user", "content": "hi"},
                                  {"type": "message", "role": "user",
                                   "content": [{"type": "input_text", "text": "there <|eos|>"}]}])
    assert r.output_text.strip() == "Be brief. hi there", r
    assert r.instructions == "Be brief.", r

    # Cut by max_output_tokens: incomplete, and why.
    r = c.responses.create(model="plain-echo", input="a b c d e f", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.output_text.strip() == "a b c" and r.usage.output_tokens == 3, r

    status, text = http(echo.url + "/metrics")
    line = 'hangar_requests_total{model="plain-echo",route="/v1/responses",status="200"}'
    assert status == 200 and line in text, [l for l in text.splitlines() if "requests_total" in l]


def test_a_streamed_response_in_the_responses_event_order(echo):
    c = oa(echo)
    events = list(c.responses.create(model="plain-echo", input="Hello there <|eos|>", stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ], events
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "Hello there"
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text and final.usage.output_tokens == 2, final
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    # The stored response is the one the stream ended with.
    assert c.responses.retrieve(final.id).output_text == text

    # The client's stream helper assembles the same response.
    with c.responses.stream(model="plain-echo", input="Hello there <|eos|>") as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text.strip() == "Hello there"


def test_a_tool_call_and_its_round_trip(echo):
    c = oa(echo)
    r = c.responses.create(model="tools-echo", input=CALL, tools=[TOOL], max_output_tokens=64)
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}, call
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed", call
    assert r.tools[0].name == "get_weather" and r.tool_choice == "auto", r

    events = list(c.responses.create(model="tools-echo", input=CALL, tools=[TOOL], max_output_tokens=64,
                                     stream=True))
    types = [e.type for e in events]
    added = types.index("response.output_item.added")
    assert types[0:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in types[added:], types
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == {"city": "Paris"}, done
    [item] = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert item.name == "get_weather" and item.arguments == done.arguments, item

    # The call and its output go back as items: the engine sees the
    # question and the tool's answer (an assistant turn with tool_calls has
    # no text for the echo to say).
    follow = c.responses.create(model="tools-echo", tools=[TOOL], max_output_tokens=64, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny <|eos|>"},
    ])
    assert follow.output_text.strip() == "What is the weather in Paris? Sunny", follow
    assert not [o for o in follow.output if o.type == "function_call"], follow


def test_reasoning_is_an_item_of_its_own(echo):
    r = oa(echo).responses.create(model="think-echo",
                                  input="<think> pondering deeply </think> The answer is 4 <|eos|>")
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    assert r.output[0].content[0].text.strip() == "pondering deeply", r.output[0]
    assert r.output_text.strip() == "The answer is 4", r


def test_a_follow_up_by_previous_response_id_then_get_and_delete(echo):
    c = oa(echo)
    first = c.responses.create(model="plain-echo", instructions="Be brief.", input="My name is Ada.",
                               max_output_tokens=6)
    assert first.output_text.strip() == "Be brief. My name is Ada.", first
    follow = c.responses.create(model="plain-echo", previous_response_id=first.id,
                                input="Who am I? <|eos|>", max_output_tokens=64)
    # The engine saw the earlier turn and its answer, but not the earlier
    # instructions (OpenAI does not carry them over).
    assert follow.output_text.strip() == "My name is Ada. Be brief. My name is Ada. Who am I?", follow
    assert follow.previous_response_id == first.id and follow.instructions is None, follow
    assert follow.usage.input_tokens > first.usage.input_tokens, (first.usage, follow.usage)
    # A chain: the third sees both earlier turns.
    third = c.responses.create(model="plain-echo", previous_response_id=follow.id, input="Bye <|eos|>",
                               max_output_tokens=64)
    assert third.output_text.strip().startswith("My name is Ada. Be brief. My name is Ada. Who am I?"), third

    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.usage == first.usage, got
    status, body = http(echo.url + f"/v1/responses/{first.id}", "DELETE")
    assert status == 200 and body == {"id": first.id, "object": "response", "deleted": True}, body
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.retrieve(first.id)
    assert e.value.body["message"] == f"Response with id '{first.id}' not found.", e.value.body
    status, body = http(echo.url + f"/v1/responses/{first.id}", "DELETE")
    assert status == 404 and body["error"]["type"] == "invalid_request_error", body
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="plain-echo", previous_response_id=first.id, input="again")
    assert e.value.body["param"] == "previous_response_id", e.value.body


def test_store_false_keeps_nothing(echo):
    c = oa(echo)
    r = c.responses.create(model="plain-echo", input="forget me <|eos|>", store=False)
    assert r.store is False and r.output_text.strip() == "forget me", r
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="plain-echo", previous_response_id=r.id, input="and now?")
    assert e.value.body["param"] == "previous_response_id", e.value.body


def test_a_clients_mistake_is_a_400_naming_the_field(echo):
    c = oa(echo)
    cases = [
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x/a.png"}]}]),
         "input", "'input[0].content[0].image_url' must be a data: URL such as data:image/png;base64,..., or a file: or http(s) URL"),
        (dict(input=[{"type": "function_call_output", "output": "x"}]), "input", "'input[0].call_id'"),
        (dict(tools=[{"type": "web_search"}]), "tools", "'tools[0]' is a 'web_search' tool"),
        (dict(tool_choice="sometimes"), "tool_choice", "'tool_choice' must be"),
        (dict(max_output_tokens=0), "max_output_tokens", "'max_output_tokens' must be a whole number"),
        (dict(temperature=5), "temperature", "'temperature' must be a number from 0 to 2"),
        (dict(background=True), "background", "'background' responses are not supported"),
        (dict(text={"format": {"type": "json_schema", "name": "x"}}), "text", "'text.format.schema'"),
        # Tools the model's template cannot show: refused by the chat path.
        (dict(model="plain-echo", tools=[TOOL]), "tools", "chat template"),
    ]
    for change, param, words in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(**{"model": "tools-echo", "input": "hi", **change})
        body = e.value.body
        assert body["param"] == param and words in body["message"], (change, body)
    # Raw: a field this host does not serve, a body that is not JSON, no input.
    status, body = http(echo.url + "/v1/responses", "POST", {"model": "plain-echo", "input": "hi", "seed": 1})
    assert status == 400 and "'seed' is not supported" in body["error"]["message"], body
    status, body = http(echo.url + "/v1/responses", "POST", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    status, body = http(echo.url + "/v1/responses", "POST", {"model": "plain-echo"})
    assert status == 400 and body["error"]["param"] == "input", body
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="no-such-model", input="hi")
    assert e.value.body["param"] == "model", e.value.body


def test_responses_need_the_api_key(env):
    srv = Server("hangar --api-key (responses)", env["base_args"] + ["--api-key", "secret"], env["proc_env"])
    try:
        for method, path, body in (("POST", "/v1/responses", {"model": "tiny-llama", "input": "hi"}),
                                   ("GET", "/v1/responses/resp_x", None),
                                   ("DELETE", "/v1/responses/resp_x", None)):
            status, answer = http(srv.url + path, method, body)
            assert status == 401 and answer["error"]["type"] == "authentication_error", (path, answer)
        key = {"Authorization": "Bearer secret"}
        # Past the key check, a request without input is the client's
        # mistake (400): no model needs loading to tell.
        status, answer = http(srv.url + "/v1/responses", "POST", {"model": "tiny-llama"}, key)
        assert status == 400 and answer["error"]["param"] == "input", answer
        status, answer = http(srv.url + "/v1/responses/resp_x", "GET", None, key)
        assert status == 404 and "'resp_x' not found" in answer["error"]["message"], answer
    finally:
        problems = srv.stop()
    assert not problems, problems
