"""Tool calls and reasoning end to end through `hangar serve`, with the
official `openai` and `anthropic` clients.

Random weights write garbage, never a tool call, so the parse path is
driven by an engine whose output the test controls: the SDK's in-process
`echo` example, which answers with the prompt's words (and stops at the
word `<|eos|>`). A prompt holding a Hermes `<tool_call>` is then an answer
that calls a tool, parsed by the host as it parses any engine's answer.
The models are folders the echo engine accepts (config.json and an empty
safetensors file) with the chat templates under test: one that renders
tools in Hermes markup, one without tools, one that marks reasoning.

A last test runs a real mlx_lm.server (the main suite's server) on a tiny
model whose template takes tools: the tools, and a tool round trip in the
history, reach the engine's template, and the answers keep OpenAI's shape.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess

import anthropic
import openai
import pytest

from conftest import HANGAR, REPO, Server, http

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "For each call return <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
PLAIN_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> <|eos|>'


def echo_model(path, template: str):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 100}))
    # The smallest valid safetensors file: an 8-byte header length, `{}`.
    (path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    """A host serving three echo models: `tools-echo`, `plain-echo`, `think-echo`."""
    for cmd in (["cargo", "build", "--quiet", "-p", "hangar"],
                ["cargo", "build", "--quiet", "-p", "hangar-sdk", "--example", "engine_echo"]):
        r = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert r.returncode == 0, r.stderr
    root = tmp_path_factory.mktemp("tools")
    plugin = root / "plugins" / "echo"
    plugin.mkdir(parents=True)
    shutil.copy(REPO / "target" / "debug" / "examples" / "libengine_echo.so", plugin / "libengine_echo.so")
    (plugin / "plugin.toml").write_text(
        'id = "echo"\nname = "echo"\nversion = "0.1.0"\nplugin_api = "^1.0"\nkind = "native"\n'
        'artifact = "engine_echo"\nformats = ["mlx"]\nin_process = true\n'
        '[capabilities]\ntool_calls = ">=1.0"\nembeddings = ">=1.0"\nrerank = ">=1.0"\n'
        '[[platforms]]\nos = "linux"\narch = "x86_64"\naccelerators = ["cpu"]\n'
    )
    models = root / "models"
    models.mkdir()
    echo_model(models / "tools-echo", TOOLS_TEMPLATE)
    echo_model(models / "plain-echo", PLAIN_TEMPLATE)
    echo_model(models / "think-echo", THINKING_TEMPLATE)
    (root / "config.toml").write_text("")
    (root / "state").mkdir()
    args = [str(HANGAR), "serve", "--port", "0", "--model-dir", str(models), "--plugins-dir", str(root / "plugins"),
            "--config", str(root / "config.toml"), "--state-dir", str(root / "state")]
    env = {"PATH": "/usr/bin:/bin", "HANGAR_PLATFORM": "linux/x86_64/cpu", "HANGAR_LOG": "info"}
    srv = Server("hangar (tools)", args, env)
    yield srv
    problems = srv.stop()
    assert not problems, problems


def oa(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def an(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_models_say_which_take_tools(echo):
    status, body = http(echo.url + "/api/models")
    assert status == 200, body
    chat = {m["model"]["id"]: m["chat"] for m in body["models"]}
    assert chat["tools-echo"] == {"template": True, "takes_tools": True, "tool_parser": "hermes", "reasoning": False}
    assert chat["plain-echo"] == {"template": True, "takes_tools": False, "tool_parser": None, "reasoning": False}
    assert chat["think-echo"]["reasoning"] is True, chat


def test_openai_tool_call_whole_and_streamed(echo):
    c = oa(echo)
    answer = c.chat.completions.create(model="tools-echo", messages=ask(CALL), tools=[WEATHER], max_tokens=64)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, choice.message
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    # Streamed: index, id and name first, then the arguments; assembled,
    # the same call.
    deltas, finish = [], None
    for chunk in c.chat.completions.create(model="tools-echo", messages=ask(CALL), tools=[WEATHER],
                                           max_tokens=64, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        deltas.extend(d.tool_calls or [])
        assert not d.content or not d.content.strip(), d
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function.name == "get_weather", deltas[0]
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}


def test_a_tool_round_trip_is_accepted(echo):
    c = oa(echo)
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny <|eos|>"},
    ]
    answer = c.chat.completions.create(model="tools-echo", messages=history, tools=[WEATHER], max_tokens=64)
    assert answer.choices[0].finish_reason == "stop", answer
    assert answer.choices[0].message.content.strip() == "What is the weather in Paris? Sunny"
    assert not answer.choices[0].message.tool_calls


def test_what_cannot_be_honoured_is_a_400_naming_it(echo):
    c = oa(echo)

    def refused(**kw) -> dict:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**{"model": "tools-echo", "messages": ask("hi"), "max_tokens": 4, **kw})
        return e.value.body

    body = refused(tools=[WEATHER], tool_choice="required")
    assert body["param"] == "tool_choice" and "'structured_output'" in body["message"] and "'echo'" in body["message"], body
    body = refused(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert "'structured_output'" in body["message"], body
    body = refused(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    assert body["param"] == "response_format" and "'structured_output'" in body["message"], body
    body = refused(model="plain-echo", tools=[WEATHER])
    assert body["param"] == "tools" and "chat template" in body["message"], body
    # Malformed: a 400 naming the field, before any engine sees it.
    body = refused(tools=[{"type": "function"}])
    assert body["param"] == "tools" and "'tools[0].function'" in body["message"], body
    body = refused(tools=[WEATHER], tool_choice="sometimes")
    assert body["param"] == "tool_choice", body
    body = refused(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "'nope'" in body["message"], body
    body = refused(messages=[{"role": "tool", "content": "x"}])
    assert "tool_call_id" in body["message"], body
    # "none" is honoured: the model is not shown the tools, and nothing is parsed.
    answer = c.chat.completions.create(model="tools-echo", messages=ask(CALL), tools=[WEATHER],
                                       tool_choice="none", max_tokens=64)
    assert answer.choices[0].finish_reason == "stop" and "<tool_call>" in answer.choices[0].message.content


def test_reasoning_is_split_off(echo):
    c = oa(echo)
    prompt = ask("<think> pondering deeply </think> The answer is 4 <|eos|>")
    answer = c.chat.completions.create(model="think-echo", messages=prompt, max_tokens=64)
    message = answer.choices[0].message
    assert message.content.strip() == "The answer is 4", message
    assert message.model_extra["reasoning_content"].strip() == "pondering deeply", message
    reasoning, text = "", ""
    for chunk in c.chat.completions.create(model="think-echo", messages=prompt, max_tokens=64, stream=True):
        if chunk.choices:
            reasoning += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            text += chunk.choices[0].delta.content or ""
    assert (reasoning.strip(), text.strip()) == ("pondering deeply", "The answer is 4")

    m = an(echo).messages.create(model="think-echo", max_tokens=64, messages=prompt)
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    assert m.content[0].thinking.strip() == "pondering deeply" and m.content[1].text.strip() == "The answer is 4"


ANTHROPIC_TOOL = {"name": "get_weather", "description": "The weather in a city.",
                  "input_schema": WEATHER["function"]["parameters"]}


def test_anthropic_tool_use_whole_and_streamed(echo):
    c = an(echo)
    m = c.messages.create(model="tools-echo", max_tokens=64, messages=ask(CALL), tools=[ANTHROPIC_TOOL])
    assert m.stop_reason == "tool_use", m
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id, use

    with c.messages.stream(model="tools-echo", max_tokens=64, messages=ask(CALL), tools=[ANTHROPIC_TOOL]) as s:
        partial = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    assert partial and json.loads("".join(partial)) == {"city": "Paris"}, partial
    assert final.stop_reason == "tool_use"
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert use.input == {"city": "Paris"}, final.content

    # The result goes back in a later user turn.
    m = c.messages.create(model="tools-echo", max_tokens=64, tools=[ANTHROPIC_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny <|eos|>"}]},
    ])
    assert m.stop_reason == "end_turn" and m.content[0].text.strip() == "Weather in Paris? Sunny", m

    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="tools-echo", max_tokens=8, messages=ask("hi"), tools=[ANTHROPIC_TOOL],
                          tool_choice={"type": "any"})
    assert "'structured_output'" in e.value.body["error"]["message"], e.value.body
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="tools-echo", max_tokens=8, messages=ask("hi"),
                          tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "'tools[0]'" in e.value.body["error"]["message"], e.value.body


TINY_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_mlx_lm_takes_tools_and_answers_in_openais_shape(env):
    """A real mlx_lm.server: tools and a tool round trip reach its chat
    template (the answers are garbage, but in OpenAI's shape)."""
    models = env["root"] / "tools-models"
    models.mkdir(exist_ok=True)
    shutil.copytree(env["models"] / "tiny-qwen", models / "tiny-qwen-tools", dirs_exist_ok=True)
    config = json.loads((models / "tiny-qwen-tools" / "tokenizer_config.json").read_text())
    config["chat_template"] = TINY_TOOLS_TEMPLATE
    (models / "tiny-qwen-tools" / "tokenizer_config.json").write_text(json.dumps(config))
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    srv = Server("hangar (mlx-lm tools)", args, env["proc_env"])
    try:
        status, body = http(srv.url + "/api/models")
        [chat] = [m["chat"] for m in body["models"] if m["model"]["id"] == "tiny-qwen-tools"]
        assert chat["takes_tools"] is True and chat["tool_parser"] == "hermes", chat
        c = oa(srv)
        history = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        ]
        for messages in (ask("Weather in Paris?"), history):
            answer = c.chat.completions.create(model="tiny-qwen-tools", messages=messages, tools=[WEATHER],
                                               max_tokens=8, temperature=0)
            choice = answer.choices[0]
            assert choice.finish_reason in ("stop", "length", "tool_calls"), choice
            assert isinstance(choice.message.content, str) or choice.message.tool_calls, choice
            chunks = list(c.chat.completions.create(model="tiny-qwen-tools", messages=messages, tools=[WEATHER],
                                                    max_tokens=8, temperature=0, stream=True))
            assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason, chunks[-1]
    finally:
        problems = srv.stop()
    assert not problems, problems


# What a forced call or a JSON answer must be: short enough for a random
# model to finish (enums, booleans, small integers), strict enough to check.
TRIP = {"type": "object", "additionalProperties": False, "required": ["city", "days", "train"],
        "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 9},
                       "train": {"type": "boolean"}}}
BOOK = {"type": "function", "function": {"name": "book_trip", "description": "Books a trip.", "parameters": TRIP}}
FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"enum": ["Paris", "Rome"]}}}}}


def is_trip(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"city", "days", "train"}
            and value["city"] in ("Paris", "Rome", "Oslo") and isinstance(value["days"], int)
            and 1 <= value["days"] <= 9 and isinstance(value["train"], bool))


@pytest.fixture(scope="module")
def constrained(env, tmp_path_factory):
    """native-mlx (which enforces grammars) on a tiny model whose template takes tools."""
    root = tmp_path_factory.mktemp("constrained")
    models = root / "models"
    models.mkdir()
    shutil.copytree(env["models"] / "tiny-qwen", models / "tiny-qwen-tools")
    config = json.loads((models / "tiny-qwen-tools" / "tokenizer_config.json").read_text())
    config["chat_template"] = TINY_TOOLS_TEMPLATE
    (models / "tiny-qwen-tools" / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "config.toml").write_text(f'[plugins.mlx-lm]\nprogram = "{env["python"]}"\nallow_programs = ["python3"]\n')
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--config") + 1] = str(root / "config.toml")
    args[args.index("--state-dir") + 1] = str(root / "state")
    srv = Server("hangar (native-mlx, constrained)", args, env["proc_env"])
    yield srv
    problems = srv.stop()
    assert not problems, problems


def test_native_mlx_enforces_forced_calls_and_json_schemas(constrained):
    c = oa(constrained)
    model = "tiny-qwen-tools"
    status, body = http(constrained.url + f"/api/resolve?model={model}")
    assert body["resolution"]["chosen"] == "native-mlx", body
    # A required call: one of the tools, with arguments of its schema.
    for seed, choice in ((1, "required"), (2, {"type": "function", "function": {"name": "book_trip"}})):
        answer = c.chat.completions.create(model=model, messages=ask("Plan my trip."), tools=[FORECAST, BOOK],
                                           tool_choice=choice, parallel_tool_calls=False, max_tokens=96,
                                           temperature=0.8, seed=seed)
        choice_ = answer.choices[0]
        assert choice_.finish_reason == "tool_calls", choice_
        [call] = choice_.message.tool_calls
        arguments = json.loads(call.function.arguments)
        if call.function.name == "book_trip":
            assert is_trip(arguments), arguments
        else:
            assert call.function.name == "forecast" and arguments["city"] in ("Paris", "Rome"), call
        if isinstance(choice, dict):
            assert call.function.name == "book_trip", call
    # Streamed, the deltas assemble into the call the whole answer gives.
    kw = dict(model=model, messages=ask("Book it."), tools=[BOOK], tool_choice="required",
              parallel_tool_calls=False, max_tokens=96, temperature=0)
    whole = c.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    name, arguments, finish = "", "", None
    for chunk in c.chat.completions.create(**kw, stream=True):
        for delta in chunk.choices:
            for call in delta.delta.tool_calls or []:
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = delta.finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("book_trip", json.loads(whole.function.arguments), "tool_calls")
    # response_format: the content is JSON of the schema.
    for fmt in ({"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP, "strict": True}},):
        answer = c.chat.completions.create(model=model, messages=ask("A trip, as JSON."), response_format=fmt,
                                           max_tokens=96, temperature=0)
        assert answer.choices[0].finish_reason == "stop", answer
        assert is_trip(json.loads(answer.choices[0].message.content)), answer
    # Anthropic: tool_choice any and tool give tool_use blocks of the schema.
    tool = {"name": "book_trip", "description": "Books a trip.", "input_schema": TRIP}
    for choice in ({"type": "any", "disable_parallel_tool_use": True},
                   {"type": "tool", "name": "book_trip", "disable_parallel_tool_use": True}):
        m = an(constrained).messages.create(model=model, max_tokens=96, messages=ask("Book a trip."),
                                            tools=[tool], tool_choice=choice)
        assert m.stop_reason == "tool_use", m
        [use] = [b for b in m.content if b.type == "tool_use"]
        assert use.name == "book_trip" and is_trip(use.input), use


def test_an_engine_without_a_grammar_refuses_structured_output(client):
    # The main suite's server serves tiny-llama with mlx-lm, which has no
    # grammar engine: a 400 naming the capability, not an unconstrained 200.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-llama", messages=ask("hi"), max_tokens=4,
                                       response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format", e.value.body
    assert "'structured_output'" in e.value.body["message"] and "'mlx-lm'" in e.value.body["message"], e.value.body
