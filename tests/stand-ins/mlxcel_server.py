#!/usr/bin/env python3
"""A protocol-faithful stand-in for Lablup's `mlxcel-server`, for tests.

First written from shared/reference/engines.md, never from Hangar's plugin,
so that it catches the plugin's mistakes; rebuilt where that note was wrong
from mlxcel's own source (repository lablup/mlxcel). Each behaviour copied
from the source names its file and commit where it is implemented below
(SOURCE: ...); README.md next to this file lists them, and what is still a
guess.

Environment:
  MLXCEL_STANDIN_VERSION    the version it pretends to be (default 0.4.2)
  MLXCEL_STANDIN_ARGV_FILE  if set, its argv (JSON list) is written there
  MLXCEL_STANDIN_LOAD_MS    how long the model takes to load (300)
  MLXCEL_STANDIN_TOKEN_MS   delay per generated token (0), to keep slots busy
  MLXCEL_STANDIN_FAIL_LOAD  if set, the load fails with this message: the
                            server logs "Failed to load model: ..." and stays
                            up, answering 503 (it never exits)
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time

# http.server, socket, tomllib and difflib are imported where needed: most
# runs in the tests are `--version`/`--help` probes, and they stay fast.

NAME = "mlxcel-server"
VERSION_TEXT = os.environ.get("MLXCEL_STANDIN_VERSION", "0.4.2")

# semver.org's grammar; build metadata is ignored, a pre-release sorts
# before its release (so 0.0.25-rc.1 does not have 0.0.25's flags).
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)


def parse_version(text: str):
    """(major, minor, patch, is_release) or None when `text` is not semver."""
    m = _SEMVER.fullmatch(text)
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3]), m[4] is None


VERSION = parse_version(VERSION_TEXT)


def has(first) -> bool:
    """Whether the pretended version has what first shipped in `first`
    (None: basic, in every version). An unparseable version is basic only."""
    if first is None:
        return True
    if VERSION is None:
        return False
    # (x, y, z, pre-release) < (x, y, z, release)
    return VERSION >= (*first, True)


# ---------------------------------------------------------------- the flags

class Flag:
    def __init__(self, names, value=None, first=None, env=None, help="", default=None,
                 negative=False, require_equals=False):
        self.names = names                # primary first; a short form, if any, is "-x"
        self.value = value                # None: boolean; else a checker kind (see check_value)
        self.first = first                # None: basic
        self.env = env                    # LLAMA_ARG_* for some basic flags
        self.help = help
        self.default = default
        self.negative = negative          # accepts a value like "-1" (clap allow_negative_numbers)
        # A boolean that takes an optional value only as `--flag=BOOL`; the
        # bare flag means true, and a value after a space is not its value.
        self.require_equals = require_equals

    @property
    def long(self) -> str:
        return next(n for n in self.names if n.startswith("--"))

    @property
    def key(self) -> str:
        return self.long[2:]

    @property
    def value_name(self) -> str:
        return self.key.upper().replace("-", "_")

    @property
    def display(self) -> str:
        return f"{self.long} <{self.value_name}>" if self.value else self.long


def _node_roles():
    return ["prefill", "decode", "router"]


FLAGS = [
    # basic
    Flag(["-m", "--model"], "text", env="LLAMA_ARG_MODEL", help="Model folder (MLX checkpoint)"),
    Flag(["-a", "--alias"], "text", env="LLAMA_ARG_ALIAS", help="Model name served by the API"),
    Flag(["--host"], "text", env="LLAMA_ARG_HOST", default="127.0.0.1", help="Address to listen on"),
    Flag(["--port"], ("uint", 0, 65535), env="LLAMA_ARG_PORT", default="8080", help="Port to listen on"),
    Flag(["-c", "--ctx-size"], ("uint", 0, None), env="LLAMA_ARG_CTX_SIZE",
         help="Context size, split across the --parallel slots (0: from the model)"),
    Flag(["-n", "--predict"], ("int", -1, None), env="LLAMA_ARG_N_PREDICT", negative=True,
         help="Tokens to predict (-1: unlimited)"),
    Flag(["--parallel"], ("uint", 1, None), env="LLAMA_ARG_N_PARALLEL", help="Number of slots"),
    Flag(["--api-key"], "text", env="LLAMA_API_KEY", help="API key clients must send"),
    Flag(["--timeout"], ("uint", 0, None), env="LLAMA_ARG_TIMEOUT", help="Server read/write timeout (s)"),
    Flag(["--chat-template"], "text", env="LLAMA_ARG_CHAT_TEMPLATE", help="Chat template"),
    Flag(["--chat-template-file"], "text", env="LLAMA_ARG_CHAT_TEMPLATE_FILE", help="Chat template file"),
    Flag(["--chat-template-kwargs"], "text", help="JSON object of extra template arguments"),
    Flag(["--no-warmup"], help="Skip the warmup run"),
    Flag(["--metrics"], help="Enable /metrics"),
    Flag(["--props"], help="Enable /props"),
    # speculative (classic draft model)
    Flag(["--model-draft", "--draft-model"], "text", (0, 0, 1), help="Draft model folder"),
    Flag(["--draft-max", "--draft"], ("uint", 0, None), (0, 0, 1), help="Draft tokens per step"),
    # SOURCE: CHANGELOG.md @ 057cebac05bd (v0.0.26, "Server flag parity for
    # KV quantization"): --cache-type-k/-v arrived with TurboQuant in 0.0.26.
    # SOURCE: src/cli/turbo_args.rs @ 04d5d0939e1d: a free string for clap
    # (Option<String>, env LLAMA_ARG_CACHE_TYPE_K/V), checked at start-up by
    # resolve_kv_cache_mode (see check_kv_cache below), so a bad value exits 1.
    Flag(["--cache-type-k"], "text", (0, 0, 26), env="LLAMA_ARG_CACHE_TYPE_K", help="K cache type"),
    Flag(["--cache-type-v"], "text", (0, 0, 26), env="LLAMA_ARG_CACHE_TYPE_V", help="V cache type"),
    # tensor parallel
    Flag(["--tp-size"], ("uint", 1, None), (0, 0, 20), help="Tensor parallel size"),
    # paged attention
    Flag(["--decode-storage-backend"], ("choice", lambda: ["auto", "dense", "paged"]), (0, 0, 21),
         default="auto", help="KV storage for decoding"),
    # distributed pipeline
    Flag(["--distributed-config"], "text", (0, 0, 22), help="Pipeline cluster TOML"),
    Flag(["--node-id"], "text", (0, 0, 22), help="This node's id"),
    Flag(["--node-role"], "node-role", (0, 0, 22), help="This node's role"),
    Flag(["--pp-layers"], "text", (0, 0, 22), help="Layers of this pipeline stage"),
    # zero-config pipeline
    Flag(["--pp-auto"], ("uint", 1, None), (0, 0, 24), help="Pipeline over N discovered nodes"),
    Flag(["--cluster-discovery"], ("choice", lambda: ["mdns"]), (0, 0, 24), help="Peer discovery"),
    Flag(["--cluster-peers"], "text", (0, 0, 24), help="Peers (host:port,...)"),
    # prompt cache
    # SOURCE: src/bin/mlx_server.rs @ 01c20350f744 (REQUIRE_EQUALS_LONGS):
    # --apc-enabled and --prompt-cache-enabled take their value only with `=`.
    Flag(["--prompt-cache-enabled"], None, (0, 0, 25), require_equals=True,
         help="Enable the prompt cache [=BOOL]"),
    # The issue 30 reading of the CHANGELOG: --no-prompt-cache from 0.4.0.
    Flag(["--no-prompt-cache"], None, (0, 4, 0), help="Disable the prompt cache"),
    Flag(["--prompt-cache-capacity-bytes"], ("uint", 0, None), (0, 0, 25), help="Prompt cache capacity"),
    Flag(["--prompt-cache-ttl"], ("uint", 0, None), (0, 0, 25), help="Prompt cache entry TTL (s)"),
    # reasoning budget
    Flag(["--reasoning-budget"], ("int", -1, None), (0, 0, 25), negative=True, default="-1",
         help="Thinking tokens (-1 unlimited, 0 none)"),
    # SOURCE: src/cli/batch_quant_args.rs @ 1b37521e5afa: --kv-bits (i32,
    # default 0 = off) and --kv-quant-scheme (a free string), both checked
    # at start-up (check_batch_kv_quant below). The release is the
    # CHANGELOG's v0.0.26 "KV cache quantization extended to continuous
    # batching" (@ 057cebac05bd), an inference: the entry names no flag.
    Flag(["--kv-bits"], ("int", -(2 ** 31), 2 ** 31 - 1), (0, 0, 26), env="LLAMA_ARG_KV_BITS", negative=True,
         default="0", help="KV quantization bits for continuous batching (8 uniform, 4 turboquant)"),
    Flag(["--kv-quant-scheme"], "text", (0, 0, 26), env="LLAMA_ARG_KV_QUANT_SCHEME",
         help="KV quantization scheme (uniform, turboquant)"),
    # APC
    # APC is on by default; off is --apc-enabled=false (require_equals, above).
    Flag(["--apc-enabled"], None, (0, 0, 26), require_equals=True,
         help="Automatic prefix caching [=BOOL] (default: true)"),
    Flag(["--apc-block-size"], ("uint", 1, None), (0, 0, 26), help="APC block size"),
    # speculative MTP / DFlash
    Flag(["--draft-kind"], ("choice", lambda: ["dflash", "mtp"]), (0, 0, 27), help="Drafter kind"),
    Flag(["--draft-block-size"], ("uint", 1, None), (0, 0, 27), help="Draft block size (MTP 4, DFlash 16)"),
    # KV cache budget (split prefill/decode is --node-role's new values)
    Flag(["--kv-cache-budget"], "kv-budget", (0, 2, 0), help="KV cache budget: BYTES, auto or none"),
    # SOURCE: src/bin/mlx_server.rs @ 01c20350f744 (`offline`, set_offline_mode:
    # one process-wide flag that also stops request-path media URL fetches).
    # Part of the llama-server b10621 series (#1432-#1448), which 0.7.0 carries
    # (Cargo.toml @ 004b8b919134 names #1432 and #1446); its first release is
    # not known here, so the stand-in has it from 0.7.0.
    Flag(["--offline"], None, (0, 7, 0), help="Resolve models locally only; never fetch (media URLs too)"),
]


class UsageError(Exception):
    """A clap error: printed to stderr, exit status 2."""


def usage_error(message: str, tip: str | None = None):
    raise UsageError(message + (f"\n\n  tip: {tip}" if tip else ""))


def check_value(flag: Flag, raw: str):
    """Validate like clap's value parsers; return the parsed value."""
    kind = flag.value
    where = f"'{flag.display}'"
    if kind == "text":
        return raw
    if kind == "node-role":
        # The reference names prefill|decode|router only for 0.2.0's split
        # prefill/decode; the earlier pipeline roles are not named, so any
        # other word is accepted (unconfirmed), and those three only from 0.2.0.
        if raw in _node_roles() and not has((0, 2, 0)):
            usage_error(f"invalid value '{raw}' for {where}")
        if not raw:
            usage_error(f"invalid value '' for {where}")
        return raw
    if kind == "kv-budget":
        if raw in ("auto", "none") or re.fullmatch(r"\d+", raw):
            return raw
        usage_error(f"invalid value '{raw}' for {where}: expected BYTES, auto or none")
    if kind[0] == "choice":
        allowed = kind[1]()
        if raw not in allowed:
            import difflib
            close = difflib.get_close_matches(raw, allowed, n=1)
            usage_error(f"invalid value '{raw}' for {where}\n  [possible values: {', '.join(allowed)}]",
                        f"a similar value exists: '{close[0]}'" if close else None)
        return raw
    if kind[0] in ("int", "uint"):
        _, low, high = kind
        if not re.fullmatch(r"-?\d+" if kind[0] == "int" else r"\d+", raw):
            usage_error(f"invalid value '{raw}' for {where}: invalid digit found in string")
        n = int(raw)
        if n < low or (high is not None and n > high):
            usage_error(f"invalid value '{raw}' for {where}: {n} is not in {low}..={high if high is not None else 'MAX'}")
        return n
    raise AssertionError(kind)


def looks_like_value(flag: Flag, token: str) -> bool:
    """clap takes the next token as the value unless it looks like a flag."""
    if token == "-" or not token.startswith("-"):
        return True
    # SOURCE: src/bin/mlx_server.rs @ 01c20350f744 (allow_negative_numbers,
    # mlxcel #1459): `--reasoning-budget -1` parses only in builds with that
    # change; before it only `--reasoning-budget=-1` did. Which release
    # brought it is a guess here (0.7.0); the `=` form parses everywhere.
    return flag.negative and has((0, 7, 0)) and re.fullmatch(r"-\d+", token) is not None


def print_help():
    lines = [f"Lablup mlxcel OpenAI-compatible server (stand-in)", "",
             f"Usage: {NAME} [OPTIONS]", "", "Options:"]
    for f in FLAGS:
        if not has(f.first):
            continue
        short = next((n for n in f.names if not n.startswith("--")), None)
        left = (f"{short}, " if short else "    ") + f.display
        extras = []
        if f.env:
            extras.append(f"[env: {f.env}=]")
        if f.default is not None:
            extras.append(f"[default: {f.default}]")
        if f.key == "parallel":
            extras.append(f"[default: {4 if has((0, 4, 0)) else 1}]")
        if isinstance(f.value, tuple) and f.value[0] == "choice":
            extras.append(f"[possible values: {', '.join(f.value[1]())}]")
        if f.key == "node-role" and has((0, 2, 0)):
            extras.append("[possible values: prefill, decode, router]")
        aliases = [n for n in f.names if n.startswith("--") and n != f.long]
        if aliases:
            extras.append(f"[aliases: {', '.join(aliases)}]")
        lines.append(f"  {left:<42} {' '.join([f.help] + extras)}")
    lines.append(f"  {'-h, --help':<42} Print help")
    lines.append(f"  {'-V, --version':<42} Print version")
    print("\n".join(lines))


def dump_flag_surface() -> None:
    """`mlxcel-server --dump-flag-surface`, from 0.7.0 in the stand-in.

    SOURCE: src/cli/flag_surface.rs @ 0c21aed20beb (flag_surface_json,
    schema_version 1) and src/bin/mlx_server.rs @ 01c20350f744: the token
    is matched only as the first argument, before clap parses anything;
    the document lists every clap argument (the built command's help and
    version included), sorted by primary long name, pretty-printed. It is
    part of the llama-server b10621 series (#1443), like --offline, so the
    stand-in has it from the same (guessed) release."""
    def entry(f: Flag) -> dict:
        short = next((n[1:] for n in f.names if not n.startswith("--")), None)
        return {"id": f.key.replace("-", "_"), "long": f.key,
                "long_aliases": sorted(n[2:] for n in f.names if n.startswith("--") and n != f.long),
                "short": short, "short_aliases": [], "env": f.env,
                "defaults": [] if f.default is None else [f.default], "hidden": False,
                "takes_value": f.value is not None, "heading": None}
    args = [entry(f) for f in FLAGS if has(f.first)]
    for key, short, help_ in (("help", "h", "Print help"), ("version", "V", "Print version")):
        args.append({"id": key, "long": key, "long_aliases": [], "short": short, "short_aliases": [],
                     "env": None, "defaults": [], "hidden": False, "takes_value": False, "heading": None})
    args.sort(key=lambda a: a["long"])
    print(json.dumps({"schema_version": 1, "binary": NAME, "args": args}, indent=2))


def parse(argv: list[str]) -> dict:
    """Parse like clap: left to right; -h/-V act where they are met; the
    first error wins. Returns {key: value} for the flags that were given
    (command line, then LLAMA_ARG_* for the basic flags)."""
    flags = [f for f in FLAGS if has(f.first)]
    longs = {n: f for f in flags for n in f.names if n.startswith("--")}
    shorts = {n: f for f in flags for n in f.names if not n.startswith("--")}
    options: dict = {}
    seen: set = set()

    def take(flag: Flag, value):
        if flag.key in seen:
            usage_error(f"the argument '{flag.display}' cannot be used multiple times")
        seen.add(flag.key)
        options[flag.key] = value

    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            if i < len(argv):
                usage_error(f"unexpected argument '{argv[i]}' found")
            break
        if arg in ("-h", "--help"):
            print_help()
            sys.exit(0)
        if arg in ("-V", "--version"):
            print(f"{NAME} {VERSION_TEXT}")
            sys.exit(0)
        if arg.startswith("--"):
            name, eq, inline = arg.partition("=")
            flag = longs.get(name)
            if flag is None:
                import difflib
                close = difflib.get_close_matches(name, list(longs), n=1, cutoff=0.8)
                usage_error(f"unexpected argument '{name}' found",
                            f"a similar argument exists: '{close[0]}'" if close else None)
        elif arg.startswith("-") and len(arg) > 1 and not re.fullmatch(r"-\d+", arg):
            name, rest = arg[:2], arg[2:]
            flag = shorts.get(name)
            if flag is None:
                usage_error(f"unexpected argument '{name}' found")
            if rest.startswith("="):
                eq, inline = "=", rest[1:]
            elif rest:
                eq, inline = "=", rest
            else:
                eq, inline = "", ""
        else:
            usage_error(f"unexpected argument '{arg}' found")
        if flag.value is None:
            if eq and flag.require_equals:
                if inline not in ("true", "false"):
                    usage_error(f"invalid value '{inline}' for '{name}[=<BOOL>]'\n  [possible values: true, false]")
                take(flag, inline == "true")
                continue
            if eq:
                usage_error(f"unexpected value '{inline}' for '{name}' found; no more were expected")
            take(flag, True)
            continue
        if eq:
            raw = inline
        elif i < len(argv) and looks_like_value(flag, argv[i]):
            raw = argv[i]
            i += 1
        else:
            usage_error(f"a value is required for '{flag.display}' but none was supplied")
        take(flag, check_value(flag, raw))

    for flag in flags:
        if flag.env and flag.key not in options and os.environ.get(flag.env) is not None:
            options[flag.key] = check_value(flag, os.environ[flag.env])
    return options


# ------------------------------------------------------------ loading

def fail(message: str):
    """A failed start after parsing (a failed load): exit status 1."""
    sys.stderr.write(f"Error: {message}\n")
    sys.stderr.flush()
    sys.exit(1)


def read_model_config(path: str, what: str) -> dict:
    if not os.path.isdir(path):
        fail(f"failed to load {what} '{path}': not a folder")
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            config = json.load(f)
    except OSError as e:
        fail(f"failed to load {what} '{path}': config.json: {e.strerror}")
    except ValueError as e:
        fail(f"failed to load {what} '{path}': config.json is not valid JSON: {e}")
    if not isinstance(config, dict):
        fail(f"failed to load {what} '{path}': config.json is not a JSON object")
    return config


MTP_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant", "qwen3_5_mtp")


# SOURCE: src/cli/turbo_args.rs @ 04d5d0939e1d (resolve_kv_cache_mode,
# parse_split_cache_type, map_kv_modes_to_cache_mode): the unspecified side
# defaults to fp16, `f16` is fp16, and only these K/V pairs are accepted.
_CACHE_MODES = {"fp16": "fp16", "f16": "fp16", "int8": "int8", "turbo4": "turbo4", "turbo4-sym": "turbo4",
                "fp16+turbo4": "turbo4-asym", "turbo4-asym": "turbo4-asym", "fp16+turbo3": "turbo3-asym",
                "turbo3-asym": "turbo3-asym", "turbo3": "turbo3-asym", "turbo4-delegated": "turbo4-delegated"}
_CACHE_PAIRS = {("fp16", "fp16"), ("int8", "int8"), ("fp16", "turbo4-asym"), ("fp16", "turbo4"),
                ("turbo4", "turbo4"), ("fp16", "turbo4-delegated"), ("fp16", "turbo3-asym")}


def check_kv_cache(options: dict) -> None:
    k, v = options.get("cache-type-k"), options.get("cache-type-v")
    if k is None and v is None:
        return
    modes = []
    for flag, value in (("--cache-type-k", k or "fp16"), ("--cache-type-v", v or "fp16")):
        mode = _CACHE_MODES.get(value.lower())
        if mode is None:
            fail(f"{flag} {value} is not a recognised KV cache type.")
        modes.append(mode)
    if tuple(modes) not in _CACHE_PAIRS:
        fail(f"unsupported KV cache combination --cache-type-k {k} --cache-type-v {v}")


def check_batch_kv_quant(options: dict) -> None:
    """SOURCE: src/server/cli_input.rs @ 01cb1ae9ffd4
    (resolve_batch_kv_quant_config) and src/lib/mlxcel-core/src/cache/
    batch_quant.rs @ 08e0903694fd (KvQuantScheme::from_str,
    BatchKvQuantConfig::validate): the scheme is parsed even when bits is 0;
    bits 0 is off; 8 needs the uniform scheme (the default), 4 the
    turboquant one; everything else fails start-up."""
    raw = options.get("kv-quant-scheme")
    scheme = "uniform"
    if raw is not None:
        lowered = raw.lower()
        if lowered in ("uniform", "affine", "mx.quantize"):
            scheme = "uniform"
        elif lowered in ("turboquant", "turbo", "turbo4"):
            scheme = "turboquant"
        else:
            fail(f'batch KV cache quant error: unknown --kv-quant-scheme "{lowered}"; '
                 'expected one of "uniform", "turboquant"')
    bits = options.get("kv-bits", 0)
    if bits < 0:
        fail(f"batch KV cache quant error: BatchKvQuantConfig: bits must be non-negative (got {bits})")
    if bits == 0 or (scheme, bits) in (("uniform", 8), ("turboquant", 4)):
        return
    expected = "8" if scheme == "uniform" else "4"
    fail(f"batch KV cache quant error: --kv-bits {bits} not supported for --kv-quant-scheme {scheme}; "
         f"expected {expected}")


def check_remote_pipeline(options: dict, cluster: dict) -> None:
    """SOURCE: src/server/startup.rs @ 00b1038bfce8
    (resolve_remote_pipeline_topology): a cluster file with
    pipeline_parallel_size above 1 starts the remote pipeline, which refuses
    --pp-layers, a drafter and tensor parallelism, and needs --node-id."""
    depth = (cluster.get("cluster") or {}).get("pipeline_parallel_size", 1)
    if not isinstance(depth, int) or depth <= 1:
        return
    if "pp-layers" in options:
        fail("remote pipeline startup is configured via cluster topology; remove --pp-layers")
    if "model-draft" in options:
        fail("remote pipeline startup does not support speculative decoding yet")
    if options.get("tp-size", 1) != 1:
        fail("remote pipeline startup does not support tensor parallelism yet")
    if "node-id" not in options:
        fail("remote pipeline startup requires --node-id so the local cluster node can be identified")


def load(options: dict) -> dict:
    model = options.get("model")
    if not model:
        fail("no model given (-m/--model)")
    # Model-independent checks run before the model is resolved
    # (src/bin/mlx_server.rs @ 01c20350f744, build_startup_input).
    check_kv_cache(options)
    read_model_config(model, "model")
    if "model-draft" in options:
        draft = read_model_config(options["model-draft"], "draft model")
        detected = "mtp" if draft.get("model_type") in MTP_MODEL_TYPES else "dflash"
        info = {"path": options["model-draft"], "classic_only": not has((0, 0, 27)),
                "detected_kind": detected, "requested_kind": options.get("draft-kind")}
        sys.stderr.write(f"{NAME} drafter: {json.dumps(info)}\n")
    if "chat-template-file" in options and not os.path.isfile(options["chat-template-file"]):
        fail(f"cannot read chat template file '{options['chat-template-file']}'")
    if "chat-template-kwargs" in options:
        try:
            kwargs = json.loads(options["chat-template-kwargs"])
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            fail("--chat-template-kwargs must be a JSON object")
    check_batch_kv_quant(options)
    if "distributed-config" in options:
        path = options["distributed-config"]
        try:
            import tomllib
        except ImportError:  # Python 3.10
            fail("reading --distributed-config needs Python 3.11 (tomllib)")
        try:
            with open(path, "rb") as f:
                content = tomllib.load(f)
        except OSError as e:
            fail(f"cannot read distributed config '{path}': {e.strerror}")
        except tomllib.TOMLDecodeError as e:
            fail(f"invalid distributed config '{path}': {e}")
        sys.stderr.write(f"{NAME} distributed-config: {json.dumps(content, sort_keys=True, default=str)}\n")
        check_remote_pipeline(options, content)
    parallel = options.get("parallel", 4 if has((0, 4, 0)) else 1)
    # SOURCE: CHANGELOG.md @ 057cebac05bd (v0.0.30, #57) and
    # src/server/startup.rs @ 00b1038bfce8 (validate_parallel_context_startup,
    # MIN_PARALLEL_CONTEXT_SIZE): from 0.0.30 one --ctx-size is split across
    # the --parallel slots and start-up refuses fewer than 512 per slot;
    # before it every slot had the whole --ctx-size.
    ctx = options.get("ctx-size", 0)
    shared = has((0, 0, 30))
    per_slot = (ctx // parallel if shared else ctx) if ctx else 0
    if ctx and shared and per_slot < 512:
        fail(f"--ctx-size {ctx} divided across {parallel} active slot(s) gives {per_slot} tokens per slot, "
             f"below the minimum supported per-slot context size of 512")
    load_ms = int(os.environ.get("MLXCEL_STANDIN_LOAD_MS", "300"))
    return {
        "options": options,
        "model_id": options.get("alias") or model,
        "parallel": parallel,
        "n_ctx_slot": per_slot,
        "failed": None,
        "busy": 0,
        "lock": threading.Lock(),
        "slots": threading.Semaphore(parallel),
        "ready_at": time.monotonic() + load_ms / 1000,
        "token_s": int(os.environ.get("MLXCEL_STANDIN_TOKEN_MS", "0")) / 1000,
        "requests": 0,
        "tokens": 0,
    }


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--dump-flag-surface"] and has((0, 7, 0)):
        dump_flag_surface()
        sys.exit(0)
    try:
        options = parse(argv)
    except UsageError as e:
        record_argv(argv)
        sys.stderr.write(f"error: {e}\n\nUsage: {NAME} [OPTIONS]\n\nFor more information, try '--help'.\n")
        sys.exit(2)
    record_argv(argv)
    sys.stderr.write(f"{NAME} argv: {json.dumps(argv)}\n")
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    state = load(options)
    # The issue 30 reading of src/bin/mlx_server.rs: with warm-up on (the
    # default) the model loads, and is warmed up, before the port opens;
    # with --no-warmup the port opens first and /health says 503 while it
    # loads. A failed load does not exit: the server stays up answering 503
    # (its model provider never becomes loaded: src/server/routes/health.rs)
    # after logging "Failed to load model".
    failure = os.environ.get("MLXCEL_STANDIN_FAIL_LOAD")
    if not options.get("no-warmup"):
        time.sleep(max(state["ready_at"] - time.monotonic(), 0))
        if failure:
            state["failed"] = failure
            sys.stderr.write(f"Failed to load model: {failure}\n")
            sys.stderr.flush()
    elif failure:
        def fail_later():
            time.sleep(max(state["ready_at"] - time.monotonic(), 0))
            state["failed"] = failure
            sys.stderr.write(f"Failed to load model: {failure}\n")
            sys.stderr.flush()
        threading.Thread(target=fail_later, daemon=True).start()
    import socket
    from http.server import ThreadingHTTPServer
    Handler = handler_class()
    Handler.state = state
    host, port = options.get("host", "127.0.0.1"), options.get("port", 8080)
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("Server6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    try:
        server = server_class((host, port), Handler)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror}")
    server.daemon_threads = True
    sys.stderr.write(f"{NAME} {VERSION_TEXT} listening on {host}:{server.server_address[1]}\n")
    sys.stderr.flush()
    server.serve_forever()


def record_argv(argv: list[str]) -> None:
    path = os.environ.get("MLXCEL_STANDIN_ARGV_FILE")
    if path:
        with open(path, "w") as f:
            json.dump(argv, f)


# ------------------------------------------------------------ serving

def error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# Routes the reference lists whose shapes it does not give: answered 501 so
# that nobody mistakes a made-up body for mlxcel's.
UNSIMULATED = ("/responses", "/messages", "/messages/count_tokens", "/cache/stats", "/cache/reset",
               "/completion", "/slots")


def handler_class():
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        state: dict = {}
        protocol_version = "HTTP/1.1"
        server_version = "mlxcel-server-stand-in"

        def log_message(self, fmt, *args):  # stderr is for the argv line and errors
            pass

        # -- plumbing

        def route(self) -> tuple[str, bool]:
            """(route without /v1, whether it had /v1)."""
            path = self.path.split("?", 1)[0]
            if path.startswith("/v1/"):
                return path[3:], True
            return path, False

        def send_json(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def send_error_json(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self.send_json(status, error_body(status, message, kind))

        def read_body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def loading(self) -> bool:
            """Not (yet) serving: loading, or a load that failed."""
            return self.state["failed"] is not None or time.monotonic() < self.state["ready_at"]

        def authorized(self) -> bool:
            key = self.state["options"].get("api-key")
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self.send_error_json(401, "Invalid API Key", "authentication_error")
                return False
            return True

        def not_found(self):
            self.send_error_json(404, f"File Not Found: {self.command} {self.path}", "not_found_error")

        # -- methods

        def do_GET(self):
            route, v1 = self.route()
            if route == "/health" and not v1:
                # SOURCE: src/server/routes/health.rs. Before the llama-server
                # b10621 alignment (@ 9629392ffde6): 503 {"status": "loading
                # model"}, 503 {"status": "no slot available"} when full, 200
                # {"status": "ok", ...}. After it (@ 08e0903694fd): 503 with
                # llama's error envelope until loaded, then 200 {"status":
                # "ok"}, never saturation. The release of the switch is a
                # guess here (0.7.0).
                aligned = has((0, 7, 0))
                if self.loading():
                    if aligned:
                        return self.send_error_json(503, "Loading model", "unavailable_error")
                    return self.send_json(503, {"status": "loading model"})
                with self.state["lock"]:
                    full = self.state["busy"] >= self.state["parallel"]
                if full and not aligned:
                    return self.send_json(503, {"status": "no slot available"})
                return self.send_json(200, {"status": "ok"})
            known = route in ("/models", "/props", "/metrics") or route in UNSIMULATED
            if not known:
                return self.not_found()
            if not self.authorized():
                return
            if self.loading():
                return self.send_error_json(503, "Loading model", "unavailable_error")
            if route == "/models":
                return self.send_json(200, {"object": "list", "data": [{
                    "id": self.state["model_id"], "object": "model", "created": 0, "owned_by": "mlxcel"}]})
            if route == "/props" and self.state["options"].get("props"):
                o = self.state["options"]
                return self.send_json(200, {
                    "model_path": o["model"], "model_alias": self.state["model_id"],
                    "total_slots": self.state["parallel"],
                    # each slot's share of --ctx-size
                    "default_generation_settings": {"n_ctx": self.state["n_ctx_slot"],
                                                    "n_predict": o.get("predict", -1)},
                    "build_info": f"{NAME} {VERSION_TEXT} (stand-in)"})
            if route == "/metrics" and self.state["options"].get("metrics"):
                text = (f"# TYPE mlxcel_requests_total counter\nmlxcel_requests_total {self.state['requests']}\n"
                        f"# TYPE mlxcel_tokens_predicted_total counter\n"
                        f"mlxcel_tokens_predicted_total {self.state['tokens']}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.send_header("Connection", "close")
                self.end_headers()
                return self.wfile.write(text)
            if route in UNSIMULATED:
                return self.send_error_json(501, f"{route} is not simulated by the stand-in", "not_supported_error")
            return self.not_found()

        def do_POST(self):
            route, _ = self.route()
            body = self.read_body()
            if route in ("/chat/completions", "/completions", "/tokenize", "/detokenize") or route in UNSIMULATED \
                    or route.startswith("/audio/"):
                if not self.authorized():
                    return
                if self.loading():
                    return self.send_error_json(503, "Loading model", "unavailable_error")
            else:
                return self.not_found()
            if route in UNSIMULATED or route.startswith("/audio/"):
                return self.send_error_json(501, f"{route} is not simulated by the stand-in", "not_supported_error")
            try:
                request = json.loads(body or b"null")
            except ValueError:
                return self.send_error_json(400, "request body is not valid JSON")
            if not isinstance(request, dict):
                return self.send_error_json(400, "request body must be a JSON object")
            if route == "/tokenize":
                words = str(request.get("content", "")).split()
                return self.send_json(200, {"tokens": [len(w) for w in words]})
            if route == "/detokenize":
                return self.send_json(200, {"content": " ".join(f"tok{t}" for t in request.get("tokens", []))})
            self.complete(route == "/chat/completions", request)

        def do_HEAD(self):
            self.not_found()

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD

        # -- completions

        def complete(self, chat: bool, request: dict) -> None:
            if chat:
                messages = request.get("messages")
                if not isinstance(messages, list) or not messages:
                    return self.send_error_json(400, "'messages' must be a non-empty array")
                words = []
                for m in messages:
                    content = m.get("content") if isinstance(m, dict) else None
                    if isinstance(content, str):
                        words += content.split()
                    elif isinstance(content, list):
                        for part in content:
                            kind = part.get("type") if isinstance(part, dict) else None
                            if kind == "text":
                                words += str(part.get("text", "")).split()
                            elif kind in ("input_audio", "audio_url") and not has((0, 0, 16)):
                                return self.send_error_json(400, f"unsupported content part type '{kind}'")
            else:
                prompt = request.get("prompt", "")
                if isinstance(prompt, list):
                    prompt = " ".join(p if isinstance(p, str) else " ".join(map(str, p)) if isinstance(p, list)
                                      else str(p) for p in prompt)
                words = str(prompt).split()
            if "thinking_budget_tokens" in request:
                if not has((0, 0, 25)):
                    return self.send_error_json(400, "unknown field `thinking_budget_tokens`")
                budget = request["thinking_budget_tokens"]
                if not isinstance(budget, int) or isinstance(budget, bool) or budget < -1:
                    return self.send_error_json(400, "'thinking_budget_tokens' must be an integer >= -1")
            options = self.state["options"]
            max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
            if max_tokens is None:
                predict = options.get("predict", -1)
                max_tokens = predict if predict >= 0 else 16
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
                return self.send_error_json(400, "'max_tokens' must be a non-negative integer")
            ctx = self.state["n_ctx_slot"]  # this slot's share of --ctx-size
            if ctx and len(words) >= ctx:
                return self.send_error_json(400, f"the request exceeds the available context size ({len(words)} "
                                                 f"prompt tokens, {ctx} per slot)", "exceed_context_size_error")
            if ctx:
                max_tokens = min(max_tokens, ctx - len(words))
            model = request.get("model") or self.state["model_id"]
            self.state["slots"].acquire()  # queue for a slot, like llama-server
            with self.state["lock"]:
                self.state["busy"] += 1
                self.state["requests"] += 1
                self.state["tokens"] += max_tokens
            try:
                self.answer(chat, request, model, len(words), max_tokens)
            finally:
                with self.state["lock"]:
                    self.state["busy"] -= 1
                self.state["slots"].release()

        def answer(self, chat: bool, request: dict, model: str, prompt_tokens: int, max_tokens: int) -> None:
            created = int(time.time())
            rid = f"{'chatcmpl' if chat else 'cmpl'}-standin-{time.monotonic_ns()}"
            tokens = [f"tok{i} " for i in range(max_tokens)]
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens}
            delay = self.state["token_s"]
            if not request.get("stream"):
                if delay:
                    time.sleep(delay * max_tokens)
                text = "".join(tokens)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                           "logprobs": None, "finish_reason": "length"} if chat
                          else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
                return self.send_json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                            "created": created, "model": model, "choices": [choice], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            obj = "chat.completion.chunk" if chat else "text_completion"

            def send(payload) -> None:
                data = payload if isinstance(payload, str) else json.dumps(payload)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()

            def chunk(choices, **extra):
                return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}

            try:
                for i, tok in enumerate(tokens):
                    if delay:
                        time.sleep(delay)
                    choice = ({"index": 0, "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": tok},
                               "logprobs": None, "finish_reason": None} if chat
                              else {"index": 0, "text": tok, "logprobs": None, "finish_reason": None})
                    send(chunk([choice]))
                last = ({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"} if chat
                        else {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"})
                send(chunk([last]))
                if (request.get("stream_options") or {}).get("include_usage"):
                    send(chunk([], usage=usage))
                send("[DONE]")
            except (BrokenPipeError, ConnectionResetError):
                pass


    return Handler

if __name__ == "__main__":
    main()
