"""Schemathesis hooks for the fuzzing test (test_openapi.py), loaded with
SCHEMATHESIS_HOOKS=schemathesis_hooks.

Generated requests to the generation routes are pointed at the served model
(random model ids would all stop at the 404, never reaching an engine), and
their valid token counts are lowered to a few, because tiny random-weight
models rarely end a turn by themselves: a valid `max_tokens` of 4e9 would
generate until the context fills, and the suite must stay fast on 2 cores.
Invalid counts (which the host must refuse) pass unchanged.
"""
from __future__ import annotations

import os

import schemathesis

GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
MAX_TOKENS = 4


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if case.operation.path not in GENERATING or not isinstance(case.body, dict):
        return
    model = os.environ.get("HANGAR_FUZZ_MODEL")
    if model and isinstance(case.body.get("model"), str) and case.body["model"]:
        case.body["model"] = model
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = case.body.get(field)
        if type(value) is int and value > MAX_TOKENS:
            case.body[field] = MAX_TOKENS
