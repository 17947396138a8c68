#!/usr/bin/env python3
"""Serving benchmark: native-mlx against mlx_lm.server, both through `hangar serve`.

Starts two `hangar serve` processes on the same model folder: one where
native-mlx serves the `mlx` format (its default), one where mlx-lm does
(`[default_engines] mlx = "mlx-lm"`). Then, rounds interleaved (A B A B ...):

- concurrency: N clients stream chat completions at once (each its own
  prompt, `max_tokens` tokens); aggregate decode tokens/s (all completion
  tokens over the round's wall time) and p50/p99 time to first token;
- long prompt: time to first token of a ~4000-token prompt, cold (a prompt
  never seen), warm (the same prompt again, from the prefix cache in
  memory), and warm after the server restarted (from a disk cache, if the
  engine keeps one).

Prints markdown tables: the median over rounds and the min-max, one row
per engine, with the first engine's throughput over each other's per round.
With --against-hangar or --against-config the second server is native-mlx
too; --and-mlx-lm keeps mlx_lm.server as a third.

Usage: serving_bench.py --hangar BIN --plugins-dir DIR --model DIR [options]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import openai

SERVING = re.compile(r"hangar: serving (\d+) model\(s\) on http://(\S+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WORDS = ("quick brown fox jumps over lazy dog small model load run stop hello world "
         "engine folder weights tokenizer config prompt tokens network step text hangar "
         "airfield pilots morning doors numbers logbooks questions answers lists red green blue").split()


class Server:
    """One `hangar serve` process and its address."""

    def __init__(self, name, args, env):
        self.name, self.args, self.env = name, args, env
        self.start()

    def start(self):
        self.url = ""
        self.proc = subprocess.Popen(self.args, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ready = threading.Event()
        self.log = []

        def read():
            for raw in self.proc.stderr:
                line = ANSI.sub("", raw.decode(errors="replace").rstrip("\n"))
                self.log.append(line)
                if not ready.is_set() and (m := SERVING.search(line)):
                    self.url = "http://" + m.group(2)
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(120):
            self.stop()
            sys.exit(f"{self.name}: hangar did not start:\n" + "\n".join(self.log[-30:]))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def text(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one(client, model, prompt, max_tokens):
    """Streams one chat completion: (time to first token s, completion tokens,
    end time, None, start time), or (.., .., end time, what failed, start
    time) when the server refused it or broke it off (as text: an exception
    of the openai client does not survive the trip back from a client
    process)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as e:  # noqa: BLE001 - every failure is reported, by name
        end = time.perf_counter()
        return end - start, tokens, end, f"{type(e).__name__}: {str(e)[:300]}", start
    end = time.perf_counter()
    return (first if first is not None else end - start), tokens, end, None, start


async def streams_of(url, model, prompts, max_tokens, ready):
    """One client process's share: its streams at once, when every client
    process has passed `ready` (a barrier shared by them all); (ttft,
    tokens, end) each, `end` and `start` as time.time()."""
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                                  timeout=3600) as client:
        # The openai client's first request in a process imports what it
        # needs and connects: 70 ms here against 4-7 ms after, counted in
        # the round's time to first token until this warm-up. A request the
        # host refuses at its edge (max_tokens 0) takes that path without
        # giving the engine any work.
        try:
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "warm-up"}], max_tokens=0,
                stream=True)
        except openai.BadRequestError:
            pass
        # A shared start time left the processes that started late (16
        # spawned at once, each importing openai) sending up to 108 ms after
        # the first: that time was the client's, counted in the round. The
        # barrier lets the round start when the last process is ready.
        await asyncio.to_thread(ready.wait, 120)
        offset = time.time() - time.perf_counter()
        results = await asyncio.gather(*(one(client, model, p, max_tokens) for p in prompts))
        return [(first, tokens, end + offset, error, start + offset)
                for first, tokens, end, error, start in results]


def client_process(args):
    return asyncio.run(streams_of(*args))


# Streams per client process. One Python process parses a few thousand
# streamed chunks a second with the openai client: with every stream in
# one event loop, 32-64 fast streams measured the client (time to first
# token equal to the whole run, aggregate flat near 4-5 k tok/s), not the
# server. Spread over processes, each loop keeps up.
STREAMS_PER_CLIENT = 4


async def concurrent(url, model, streams, prompts, max_tokens):
    import multiprocessing
    groups = [prompts[i:i + STREAMS_PER_CLIENT] for i in range(0, streams, STREAMS_PER_CLIENT)]
    groups[-1] = groups[-1][:streams - STREAMS_PER_CLIENT * (len(groups) - 1)]
    # Every process is started (and has imported openai and warmed up)
    # before any sends.
    spawn = multiprocessing.get_context("spawn")
    with spawn.Manager() as manager, spawn.Pool(len(groups)) as pool:
        ready = manager.Barrier(len(groups))
        parts = await asyncio.to_thread(
            pool.map, client_process, [(url, model, g, max_tokens, ready) for g in groups])
    results = [r for part in parts for r in part]
    # From the first request sent to the last answer's end, as
    # native-mlx-bench --concurrent counts (its clock starts at the first
    # submission): a client process that starts late is not the server's
    # time. How far apart the requests were sent is reported beside it.
    first_sent = min(r[4] for r in results)
    wall = max(r[2] for r in results) - first_sent
    ttfts = sorted(r[0] for r in results if r[3] is None) or [float("nan")]
    total = sum(r[1] for r in results)
    return {
        "tok_s": total / wall,
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "ttft_mean": statistics.fmean(ttfts),
        # Answers shorter than asked (an end-of-sequence token) leave the
        # batch early: the aggregate counts only what was generated.
        "short": sum(1 for r in results if r[3] is None and r[1] < max_tokens),
        "send_spread": max(r[4] for r in results) - first_sent,
        "wall": wall,
        "errors": [r[3] for r in results if r[3] is not None],
    }


def host_first_tokens(url):
    """The host's own count and sum of seconds from a streamed request's
    arrival to its first token (`hangar_time_to_first_token_seconds` on
    /metrics, every model), or None."""
    import urllib.request
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for kind in total:
            if line.startswith(f"hangar_time_to_first_token_seconds_{kind}{{"):
                total[kind] += float(line.rsplit(" ", 1)[1])
    return total


def engine_steps(root, engine):
    """The engine's step statistics as it last wrote them (native-mlx, with
    NATIVE_MLX_STATS_FILE), or None."""
    try:
        with open(os.path.join(root, engine, "steps.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps_between(before, after):
    """What the engine's steps did between two readings, as native-mlx-bench
    prints it, or "" where the engine wrote none."""
    if not after:
        return ""
    before = before or {k: 0 for k in after}
    d = {k: after[k] - before.get(k, 0) for k in after if k != "peak_batch"}
    per = lambda ms, n: ms / n if n else 0.0
    return (f"{d['decode_steps']} decode-only at {per(d['decode_ms'], d['decode_steps']):.2f} ms "
            f"({per(d['decode_rows'], d['decode_steps']):.1f} rows) each, {d['mixed_steps']} with prompt "
            f"chunks at {per(d['mixed_ms'], d['mixed_steps']):.2f} ms ({per(d['mixed_rows'], d['mixed_steps']):.1f} "
            f"rows, {per(d['mixed_prompt_tokens'], d['mixed_steps']):.0f} prompt tokens) each"
            + (f"; {d['requests']} requests, {per(d['first_token_ms'], d['requests']):.0f} ms from "
               f"reaching the engine to their first token on average ("
               f"{per(d['queue_ms'], d['requests']):.0f} ms before admission; starting them took "
               f"{d['admit_ms']:.1f} ms of the engine thread in all)" if d.get("requests") else "")
            + (f"; {d['prompt_chunks']} prompt chunks in {d['chunk_groups']} attention groups, "
               f"{d['chunks_as_rows']} as decoding rows" if "prompt_chunks" in d else ""))


def percentile(sorted_values, p):
    if len(sorted_values) == 1:
        return sorted_values[0]
    k = (len(sorted_values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def ttft(url, model, prompt):
    """Time to first token and the reported cached prompt tokens of one request."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600)
    start = time.perf_counter()
    first = None
    cached = None
    prompt_tokens = None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4, temperature=0,
        stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = details.cached_tokens if details is not None else None
    return (first if first is not None else time.perf_counter() - start), prompt_tokens, cached


def prompt_of_tokens(url, model, rng, want):
    """A prompt of about `want` tokens (measured through the server)."""
    words = want // 2
    for _ in range(4):
        p = text(rng, words)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600)
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                           max_tokens=1)
        got = r.usage.prompt_tokens
        if abs(got - want) <= want // 50:
            return p
        words = max(1, int(words * want / got))
    return text(rng, words)


def summary(values):
    return statistics.median(values), min(values), max(values)


def fmt(values, unit_scale=1.0, digits=0):
    if not values:
        return "no run"
    m, lo, hi = summary([v * unit_scale for v in values])
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def main():
    # A TERM (a timeout, a supervisor) runs the `finally` below too, so no
    # `hangar serve` outlives the benchmark.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hangar", required=True)
    ap.add_argument("--plugins-dir", required=True)
    ap.add_argument("--model", required=True, help="the model folder both engines serve")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs mlx_lm.server")
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--long-prompt-tokens", type=int, default=4000)
    ap.add_argument("--long-rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--against-hangar", metavar="BIN",
                    help="compare native-mlx under --hangar with native-mlx under this hangar binary "
                         "(instead of mlx_lm.server)")
    ap.add_argument("--against-config", metavar="TOML",
                    help="compare native-mlx with native-mlx under these config.toml lines, e.g. "
                         "'[plugins.native-mlx]\\nisolation = \"none\"' (instead of mlx_lm.server)")
    ap.add_argument("--and-mlx-lm", action="store_true",
                    help="with --against-hangar or --against-config, also run mlx_lm.server")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="hangar-serving-bench-")
    models = os.path.join(root, "models")
    os.makedirs(models)
    name = "bench"
    os.symlink(os.path.abspath(args.model), os.path.join(models, name))
    env = {k: v for k, v in os.environ.items()
           if k not in ("HANGAR_API_KEY", "HANGAR_MODEL_DIR", "HANGAR_PLUGINS_DIR", "HANGAR_CONFIG",
                        "HANGAR_SETTINGS")}
    env.setdefault("HANGAR_LOG", "warn")
    servers = {}
    # Each server by its label: native-mlx and mlx-lm, or with --against-hangar
    # native-mlx under two hangar binaries (an allocator, a build option).
    # native-mlx under two hangar binaries (an allocator, a build option), or
    # under two configurations (`isolation = "none"`: the engine inside the
    # host, without the worker's hop).
    runs = [("native-mlx", "native-mlx", args.hangar, "")]
    if args.against_hangar:
        runs.append((f"native-mlx@{os.path.basename(args.against_hangar)}", "native-mlx",
                     args.against_hangar, ""))
    elif args.against_config:
        extra = args.against_config.replace("\\n", "\n")
        label = re.sub(r"[^A-Za-z0-9.]+", "-", extra.strip().splitlines()[-1]).strip("-")
        runs.append((f"native-mlx@{label}", "native-mlx", args.hangar, extra))
    if args.and_mlx_lm or not (args.against_hangar or args.against_config):
        runs.append(("mlx-lm", "mlx-lm", args.hangar, ""))
    for label, engine, hangar, extra in runs:
        home = os.path.join(root, label)
        os.makedirs(os.path.join(home, "state"))
        with open(os.path.join(home, "config.toml"), "w") as f:
            f.write(f'[plugins.mlx-lm]\nprogram = "{args.python}"\nallow_programs = ["python3"]\n')
            f.write(extra + "\n")
        with open(os.path.join(home, "settings.toml"), "w") as f:
            f.write(f'[default_engines]\nmlx = "{engine}"\n')
        # native-mlx writes its step statistics each time it goes idle:
        # where a round's time went inside the engine (decoding steps,
        # steps with prompt chunks), against native-mlx-bench --concurrent.
        engine_env = dict(env, NATIVE_MLX_STATS_FILE=os.path.join(home, "steps.json"))
        servers[label] = Server(label, [
            hangar, "serve", "--port", "0", "--model-dir", models,
            "--plugins-dir", args.plugins_dir, "--config", os.path.join(home, "config.toml"),
            "--state-dir", os.path.join(home, "state")], engine_env)
    order = list(servers)
    try:
        rng = random.Random(0)
        # Warm-up: load the model, then each stream count once (a few
        # tokens), so that no round measures MLX compiling the kernels of a
        # batch size it has not run yet (a GPU's first 32-stream round
        # took twice as long); native-mlx-bench --concurrent likewise leaves
        # its warm-up run out.
        streams = [int(s) for s in args.streams.split(",")]
        for engine, srv in servers.items():
            asyncio.run(concurrent(srv.url, name, 2, [text(rng, 20)] * 2, 8))
            for n in streams:
                asyncio.run(concurrent(srv.url, name, n, [f"warm-up {i}: " + text(rng, args.prompt_words)
                                                          for i in range(n)], 8))
        results = {e: {n: [] for n in streams} for e in servers}
        for r in range(args.rounds):
            for n in streams:
                for engine in (order if r % 2 == 0 else order[::-1]):
                    # Fresh prompts every round: no prefix is shared.
                    prompts = [f"{r}-{n}-{i}: " + text(rng, args.prompt_words) for i in range(n)]
                    before = engine_steps(root, engine)
                    host_before = host_first_tokens(servers[engine].url)
                    res = asyncio.run(concurrent(servers[engine].url, name, n, prompts, args.max_tokens))
                    res["steps"] = steps_between(before, engine_steps(root, engine))
                    # Where a client's time to first token goes: the
                    # host's own measure of it, from each request's arrival.
                    host_after = host_first_tokens(servers[engine].url)
                    if host_before and host_after and host_after["count"] > host_before["count"]:
                        res["host_ttft_mean"] = ((host_after["sum"] - host_before["sum"])
                                                 / (host_after["count"] - host_before["count"]))
                    results[engine][n].append(res)
                    host = (f" (mean {res['ttft_mean']*1000:.0f} ms; the host's own mean "
                            f"{res['host_ttft_mean']*1000:.0f} ms)" if "host_ttft_mean" in res else "")
                    print(f"round {r} streams {n} {engine}: {res['tok_s']:.0f} tok/s, "
                          f"ttft p50 {res['ttft_p50']*1000:.0f} ms p99 {res['ttft_p99']*1000:.0f} ms{host}, "
                          f"{res['wall']:.2f} s from the first request sent ({res['send_spread']*1000:.0f} ms "
                          f"between the first and the last), "
                          f"{res['short']} answers short of {args.max_tokens} tokens, "
                          f"{len(res['errors'])} failed" + (f" (first: {res['errors'][0]})" if res['errors'] else ""),
                          file=sys.stderr, flush=True)
                    if res["steps"]:
                        print(f"    {engine} steps: {res['steps']}", file=sys.stderr, flush=True)

        long = {e: {"cold": [], "warm": [], "disk": [], "cached": [], "prompt": []} for e in servers}
        for r in range(args.long_rounds):
            for engine in (order if r % 2 == 0 else order[::-1]):
                srv = servers[engine]
                p = prompt_of_tokens(srv.url, name, random.Random(1000 + r), args.long_prompt_tokens)
                # The calibration request already saw `p`: the cold run takes a variant.
                p = f"round {r} {engine} " + p
                cold, prompt_tokens, _ = ttft(srv.url, name, p)
                warm, _, cached = ttft(srv.url, name, p)
                srv.stop()
                srv.start()
                ttft(srv.url, name, text(rng, 5))  # load the model again
                disk, _, disk_cached = ttft(srv.url, name, p)
                long[engine]["cold"].append(cold)
                long[engine]["warm"].append(warm)
                long[engine]["disk"].append(disk)
                long[engine]["cached"].append((cached, disk_cached))
                long[engine]["prompt"].append(prompt_tokens)
                print(f"long round {r} {engine}: {prompt_tokens} tokens, cold {cold*1000:.0f} ms, "
                      f"warm {warm*1000:.0f} ms (cached {cached}), after restart {disk*1000:.0f} ms "
                      f"(cached {disk_cached})", file=sys.stderr, flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"concurrency": results, "long": long}, f, indent=1)
    a = order[0]
    print(f"\n### Concurrent streaming chat, {args.max_tokens} tokens each, {args.rounds} rounds "
          f"(median, min–max)\n")
    print(f"| streams | engine | tok/s | {a} / engine | TTFT p50 ms | TTFT p99 ms | failed, short answers |")
    print("|---|---|---|---|---|---|---|")
    for n in streams:
        for e in order:
            # A run with failed requests gives no figure (its throughput and
            # times measure the failure); the last column counts them.
            ok = [x for x in results[e][n] if not x["errors"]]
            ratio = [x["tok_s"] / y["tok_s"] for x, y in zip(results[a][n], results[e][n])
                     if not x["errors"] and not y["errors"]]
            print(f"| {n} | {e} | {fmt([x['tok_s'] for x in ok])} "
                  f"| {'' if e == a else fmt(ratio, digits=2)} "
                  f"| {fmt([x['ttft_p50'] for x in ok], 1000)} | {fmt([x['ttft_p99'] for x in ok], 1000)} "
                  f"| {sum(len(x['errors']) for x in results[e][n])}, {sum(x['short'] for x in ok)} |")
    if not args.long_rounds:
        return
    print(f"\n### Time to first token of a long prompt, {args.long_rounds} rounds (median, min–max, ms)\n")
    print("| engine | prompt tokens | cold | warm (memory) | warm / cold | after restart | restart / cold "
          "| cached tokens (warm, restart) |")
    print("|---|---|---|---|---|---|---|---|")
    for e in order:
        L = long[e]
        print(f"| {e} | {L['prompt'][0]} | {fmt(L['cold'], 1000)} | {fmt(L['warm'], 1000)} "
              f"| {fmt([w / c for w, c in zip(L['warm'], L['cold'])], digits=3)} | {fmt(L['disk'], 1000)} "
              f"| {fmt([d / c for d, c in zip(L['disk'], L['cold'])], digits=3)} | {L['cached']} |")


if __name__ == "__main__":
    main()
