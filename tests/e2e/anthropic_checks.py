"""The Anthropic Messages API checks every engine's end-to-end test runs:
the official `anthropic` client against `POST /v1/messages` on a real
engine, streaming and not, with a system prompt, text blocks, sampling
fields and stop sequences.

Random weights produce garbage text, so the checks compare the host's
answers with each other (greedy decoding is deterministic), never with
expected words.
"""
from __future__ import annotations

import anthropic

USER = [{"role": "user", "content": [{"type": "text", "text": "Hello there,"}, {"type": "text", "text": "how are you?"}]}]
# Greedy. This client version no longer has keyword arguments for the
# sampling fields; the API still takes them, sent as extra body fields.
SAMPLING = {"temperature": 0, "top_k": 1, "top_p": 1.0}
ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]


def client(base_url: str, key: str = "unused") -> anthropic.Anthropic:
    # No retries: a failure must show, not be hidden by a second attempt.
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)


def create(c: anthropic.Anthropic, model: str, max_tokens: int, **kw):
    return c.messages.create(
        model=model, max_tokens=max_tokens, system="You are terse.", messages=USER, extra_body=SAMPLING, **kw,
    )


def streamed(c: anthropic.Anthropic, model: str, max_tokens: int, **kw):
    """(event types in order, the text of the deltas, the final message)."""
    with c.messages.stream(
        model=model, max_tokens=max_tokens, system=[{"type": "text", "text": "You are terse."}], messages=USER,
        extra_body=SAMPLING, **kw,
    ) as stream:
        types, text = [], ""
        for event in stream:
            if event.type in ORDER:  # the client adds its own `text` events
                types.append(event.type)
            if event.type == "content_block_delta":
                assert event.delta.type == "text_delta", event
                text += event.delta.text
        return types, text, stream.get_final_message()


def collapse(types: list[str]) -> list[str]:
    """Runs of deltas as one, for comparing orders."""
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]


def exercise(base_url: str, model: str, max_tokens: int = 12):
    c = client(base_url)
    whole = create(c, model, max_tokens)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == model, whole
    assert whole.id.startswith("msg_"), whole.id
    assert [b.type for b in whole.content] == ["text"], whole.content
    text = whole.content[0].text
    assert whole.stop_reason in ("max_tokens", "end_turn"), whole
    assert whole.stop_sequence is None, whole
    assert 0 < whole.usage.output_tokens <= max_tokens, whole.usage
    assert whole.usage.input_tokens > 0, whole.usage
    if whole.stop_reason == "max_tokens":
        assert whole.usage.output_tokens == max_tokens, whole.usage

    types, streamed_text, final = streamed(c, model, max_tokens)
    expected = ORDER if streamed_text else [t for t in ORDER if t != "content_block_delta"]
    assert collapse(types) == expected, types
    assert streamed_text == text, (streamed_text, text)
    assert final.content[0].text == text and final.stop_reason == whole.stop_reason, final
    assert final.usage.output_tokens == whole.usage.output_tokens, final.usage
    assert final.usage.input_tokens == whole.usage.input_tokens, final.usage

    # A stop sequence from the middle of the greedy answer: the answer ends
    # just before its first occurrence, streaming and not.
    assert len(text) >= 6, f"the greedy answer is too short to cut: {text!r}"
    stop = text[3:6]
    before = text[: text.find(stop)]
    cut = create(c, model, max_tokens, stop_sequences=["never-in-garbage-\u2603", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
    assert cut.content[0].text == before, (cut.content[0].text, before, text)
    assert 0 < cut.usage.output_tokens <= whole.usage.output_tokens, cut.usage
    types, streamed_text, final = streamed(c, model, max_tokens, stop_sequences=[stop])
    assert streamed_text == before and final.stop_reason == "stop_sequence" and final.stop_sequence == stop, final
    assert collapse(types)[-3:] == ORDER[-3:], types
