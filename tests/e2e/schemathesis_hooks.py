"""Schemathesis hooks for the fuzzing test (test_openapi.py), loaded with
SCHEMATHESIS_HOOKS=schemathesis_hooks.

Generated requests to the generation routes are pointed at the served model
(random model ids would all stop at the 404, never reaching an engine), and
their valid token counts are lowered to a few, because tiny random-weight
models rarely end a turn by themselves: a valid `max_tokens` of 4e9 would
generate until the context fills, and the suite must stay fast on 2 cores.
Invalid counts (which the host must refuse) pass unchanged. In the same
way the embedding routes are pointed at HANGAR_FUZZ_EMBEDDER and rerank at
HANGAR_FUZZ_RERANKER where the run sets them (test_embeddings_native.py).
"""
from __future__ import annotations

import os

import schemathesis

GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
              "/ollama/api/chat", "/ollama/api/generate"}
# Ollama's routes: the count is `options.num_predict`, and no count at all
# means no limit.
OLLAMA = {"/ollama/api/chat", "/ollama/api/generate"}
MAX_TOKENS = 4
# The model each route's requests are pointed at, by the variable naming it.
MODEL_OF = {path: "HANGAR_FUZZ_MODEL" for path in GENERATING} | {
    "/v1/embeddings": "HANGAR_FUZZ_EMBEDDER", "/ollama/api/embed": "HANGAR_FUZZ_EMBEDDER",
    "/ollama/api/embeddings": "HANGAR_FUZZ_EMBEDDER", "/v1/rerank": "HANGAR_FUZZ_RERANKER"}


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    # Removing the model the generation routes are pointed at would leave
    # them 404s for the rest of the run; the fuzz host's other models may go.
    kept = os.environ.get("HANGAR_FUZZ_MODEL")
    if case.method.upper() == "DELETE" and case.operation.path == "/api/models/{id}":
        if (case.path_parameters or {}).get("id") == kept:
            case.path_parameters["id"] = "fuzz-kept-" + case.path_parameters["id"]
        return
    if case.method.upper() == "DELETE" and case.operation.path == "/ollama/api/delete":
        if isinstance(case.body, dict):
            for field in ("model", "name"):
                name = case.body.get(field)
                if isinstance(name, str) and name.removesuffix(":latest") == kept:
                    case.body[field] = "fuzz-kept-" + name
        return
    if case.operation.path not in MODEL_OF or not isinstance(case.body, dict):
        return
    model = os.environ.get(MODEL_OF[case.operation.path])
    if model and isinstance(case.body.get("model"), str) and case.body["model"]:
        case.body["model"] = model
    if case.operation.path not in GENERATING:
        return
    if case.operation.path in OLLAMA:
        options = case.body.get("options")
        if options is None:
            case.body["options"] = options = {}
        if isinstance(options, dict):
            count = options.get("num_predict")
            if count is None or (type(count) is int and (count > MAX_TOKENS or count in (-1, -2))):
                options["num_predict"] = MAX_TOKENS
        # keep_alive 0 would unload the model after every answer.
        if case.body.get("keep_alive") in (0, "0", 0.0):
            case.body.pop("keep_alive")
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = case.body.get(field)
        if type(value) is int and value > MAX_TOKENS:
            case.body[field] = MAX_TOKENS
