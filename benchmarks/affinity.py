#!/usr/bin/env python3
"""Cache-affine routing among one host's replicas (issue 47, item 2): multi-turn
conversations with a shared system prompt sent to 2 and 4 replicas of a small model,
four rules side by side, each judged by the engines' own figures (``timings.prompt_n``:
prompt tokens evaluated, ``timings.cache_n``: taken from the cache).

One host, as its units run it: a private bus, ``lokid daemon`` (local runner) and ``lokid
gateway``. The config holds one preset per replica count (``replicas = N``, the generated
tiny llama, ``-np 4`` slots of 8,192 tokens each, ``--engine-args`` added); a rule's run
starts its preset (StartPreset over D-Bus) and waits until every engine is ready, and
stops it after (StopPreset, every port closed): each rule gets fresh engines, so no rule
inherits another's caches, and each has a system prompt of its own as well. The rules:

- **affinity**: every request to the gateway, which routes it among the replicas
  (lokid.gateway.replicas, lokid.core.serve.affinity); its hop is counted against it;
- **round-robin**: the client sends each request to the replicas' own ports in turn;
- **fewest** in flight (the rule before issue 47): the client sends each request to the
  replica with the fewest of its requests in flight (no hop either);
- **router**: llama.cpp's router (``llama-server --models-preset``, one model, started
  fresh for the rule) with ONE engine of the same model: ``-np`` = 4 x N slots of 8,192
  tokens (the same slots in all) and ``kv-unified`` on (what the engine picks when it
  chooses its own slot count; it lets its slots share one KV buffer); one warm-up
  request loads it first.

With 2 in ``--replicas``, **affinity x1** runs too: the affinity rule on a one-replica
preset (``-np 4``), for "throughput with 2 replicas >= 1.8 x one replica" (requests per
second under the same load); that needs as many free cores as the engines use, which
2 CPUs are not (said in the output).

Per rule: prompt tokens evaluated (and ratio to round-robin's of the same N; goal <=
0.25), cache hits (cache_n / (prompt_n + cache_n); goal >= 90 %), each request's time to
its answer (``--tokens`` tokens, not streamed: time to first token plus a few tokens)
p50 and p95 (p50 ratio to round-robin; goal <= 0.4), requests per second, failures.
Token counts are the engines' and do not depend on the machine's load; the times do.

Measured on the 2-CPU development machine, ``.venv/bin/python benchmarks/affinity.py
--seed 47`` (263 requests a rule, 5 minutes; load 1.2 at the start, 2-6.5 during it,
mostly the run's own engines; rules run affinity, round-robin, router, fewest, affinity
x1 at 2 replicas and round-robin, affinity, router, fewest at 4):

    2 replicas (4 slots each; router: one engine of 8 slots)
    rule          evaluated   ÷ rr    cached   hits   p50 ms   ÷ rr   p95 ms  req/s failed
    affinity          52046   0.46    631476  92.4%    354.3   0.76   1782.7  11.70      0
    round-robin      113524   1.00    574732  83.5%    468.0   1.00   2456.7   9.88      0
    fewest            53136   0.47    636698  92.3%    849.5   1.82   1601.5   9.63      0
    router            68252   0.60    620004  90.1%    201.8   0.43    499.3  28.22      0
    affinity x1      135723   1.20    545169  80.1%    349.6   0.75    490.2  22.14      0
    ideal             45968   0.40   (a perfect cache: 8 slots read the system prompt once)

    4 replicas (4 slots each; router: one engine of 16 slots)
    rule          evaluated   ÷ rr    cached   hits   p50 ms   ÷ rr   p95 ms  req/s failed
    affinity          56107   0.42    632149  91.8%    333.4   0.44   2164.9  10.42      0
    round-robin      133315   1.00    552837  80.6%    764.3   1.00   3504.1   5.93      0
    fewest            50114   0.38    642350  92.8%    416.2   0.54   2255.0  10.27      0
    router            56851   0.43    627197  91.7%    194.8   0.25    703.2  30.18      0
    ideal             45904   0.34   (a perfect cache: 8 slots read the system prompt once)

Two runs of the same command beside other helpers' tests (load 4-13) evaluated
(affinity, round-robin, fewest, router) 52,390 / 115,324 / 56,918 / 69,627 and 52,307 /
109,865 / 51,728 / 59,343 tokens at 2 replicas, 53,408 / 119,981 / 50,673 / 57,836 and
54,203 / 120,009 / 51,823 / 55,013 at 4: affinity's count repeats within 5 %, the
others' within 10-17 %; times moved 2-3 x with the load. What the runs say:

- Cache hits >= 90 %: met by affinity (91.8-92.4 % in all runs), and by fewest too;
  the router 89.9-92.0 %.
- Evaluated <= 0.25 x round-robin's: not met (0.42-0.48), and no rule can meet it on
  this workload: ``ideal`` (a perfect cache, from round-robin's own requests) evaluates
  0.34-0.42 x round-robin's. Round-robin already reads the system prompt from cache
  (81-84 % hits: every slot holds it after its first read), and what is left is each
  turn's new text (the client's answer differs from the engine's, and its next
  question), which no routing can skip. Affinity evaluates 13-22 % above that floor.
- Affinity no better than fewest in flight by tokens: a closed loop (a client's next
  turn follows its answer at once) sends a turn back to the engine that just answered
  it, which is then the least loaded (benchmarks/affinity_peers.py found the same).
- Answer time p50 <= 0.4 x round-robin's: not met at 2 replicas in any run (0.76 quiet,
  0.69 and 1.27 loaded); at 4 within noise (0.44 quiet, 0.35 and 0.53 loaded).
- One engine beats N on 2 CPUs: the router's single engine of 4 x N slots answered
  28-30 requests/s, the replicas 6-12, one replica (affinity x1) 22: N engines share
  the same two cores and batch less each.
- Throughput, 2 replicas vs 1: 0.53 (0.22 and 0.81 in the loaded runs): on 2 CPUs each
  engine's threads already use both, so a second replica adds no compute and cannot
  show 1.8 x.

Within one engine (issue 47: ``--slot-prompt-similarity``, ``--cache-reuse``), the
affinity rule at 2 replicas, ``--replicas 2 --rules affinity --no-one --seed 47
--engine-args ARGS``, evaluated tokens (ideal 45,824) and cache hits:

    engine args                evaluated   hits
    (defaults: -sps 0.10)          52605  92.3%
    -sps 0.5                       50943  92.5%
    -sps 0.9                       46102  93.3%
    --cache-reuse 256              57275  91.6%
    -cram 0 (no host cache)        51785  92.4%
    -kvu                           61332  91.0%

Seed 48 (256 requests): defaults 52,163, ``-sps 0.9`` 46,119 (ideal 45,005).
``-sps 0.9`` comes within 1-2.5 % of the floor (which slot each turn took was not traced);
``--cache-reuse 256`` and a unified KV evaluate more; the host prompt cache (``-cram``)
changes nothing here. With ``-sps 0.9`` for every rule (``--seed 47 --rules
affinity,round-robin,fewest --no-one --engine-args '["-sps", "0.9"]'``, load 9-13),
evaluated tokens at 2 replicas: affinity 46,198, round-robin 78,088, fewest 47,179
(ideal 45,968); at 4: 49,978, 102,655, 49,140 (ideal 45,904); cache hits 93.2 / 88.7 /
93.2 % and 92.7 / 85.0 / 92.9 %: fewer tokens for every rule than with the default 0.10
(round-robin's the most), so affinity's ratio to round-robin rises (0.59 and 0.49).
Again at load 2-7: 47,032 / 71,283 / 46,612 at 2 replicas, 49,250 / 110,194 / 48,765 at
4; answer p50 208 / 335 / 640 ms and 744 / 428 / 361 ms (the times within noise). The
counts say: ``-sps 0.9`` takes 5,000-6,500 tokens (10-12 %) off affinity's at 2
replicas (6-12 % at 4) and 29-38 % off round-robin's (8-20 % at 4); lokid could set it
for presets with replicas or several slots (not set by this commit).

    .venv/bin/python benchmarks/affinity.py [--replicas 2,4] [--conversations 32]
        [--clients 8] [--turns 6-10] [--system 1500] [--tokens 4] [--seed N]
        [--rules affinity,round-robin,fewest,router] [--engine-args '["-sps", "0.5"]']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import aiohttp  # noqa: E402
from affinity_peers import Side, system_prompt  # noqa: E402
from dbus_fast import BusType, Message, MessageType  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from gateway_latency import gateway_process  # noqa: E402
from routerkit import router_process  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import engine_binary, free_port, free_ports, write_config, write_preset  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.openai_load import pct  # noqa: E402

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH  # noqa: E402

RULES = ("affinity", "round-robin", "fewest", "router")
ONE = "affinity x1"    # the affinity rule on one replica (throughput, 1 vs 2)
SLOTS = 4              # -np of each replica
SLOT_CTX = 8192        # tokens of each slot
MODEL = "long.gguf"


@dataclass
class Run(Side):
    """A rule's figures, and each request's (conversation, turn, prompt tokens, cached)
    for the ideal's floor."""
    requests: list[tuple[int, int, int, int]] = field(default_factory=list)


def ideal(run: Run, slots: int) -> int:
    """The prompt tokens a perfect cache would evaluate for ``run``'s requests: each slot
    reads the shared system prompt once (S: the most a first turn was served from
    cache), a first turn the rest of its prompt, a later turn what its prompt adds to its
    previous turn's (the answer the client sends back differs from the engine's own)."""
    shared = max((c for _, k, _, c in run.requests if k == 1), default=0)
    total, last = slots * shared, dict[int, int]()
    for conv, k, prompt, _ in sorted(run.requests):
        total += prompt - (shared if k == 1 else last[conv])
        last[conv] = prompt
    return total


def preset_name(n: int) -> str:
    return f"r{n}"


def write_host(root: Path, counts: list[int], engine_args: list[str]
               ) -> tuple[Path, dict[int, int]]:
    """The host's config: a preset ``rN`` of N replicas for each count, each on a run of
    N free ports; returns it and each preset's first port."""
    (root / "models").mkdir(parents=True)
    write_llama(root / "models" / MODEL, context_length=SLOT_CTX * SLOTS * 4)
    config = write_config(root, engine_binary(), [root / "models"])
    ports = {}
    for n in counts:
        ports[n] = free_ports(n)
        write_preset(config, preset_name(n), f'model = "{MODEL}"\nctx = {SLOT_CTX * SLOTS}\n'
                     f'port = {ports[n]}\n'
                     f'extra_args = {json.dumps(["-np", str(SLOTS), *engine_args])}\n'
                     f'[serve]\nreplicas = {n}\n')
    return config, ports


def router_ini(root: Path, n: int, engine_args: list[str]) -> Path:
    """The router's preset: one engine of the model, 4 x N slots of SLOT_CTX tokens;
    ``engine_args`` as its keys (``--cache-reuse 256`` as ``cache-reuse = 256``)."""
    keys = {"model": str(root / "models" / MODEL), "ctx-size": str(SLOT_CTX * SLOTS * n),
            "parallel": str(SLOTS * n), "kv-unified": "true"}
    i = 0
    while i < len(engine_args):
        key = engine_args[i].lstrip("-")
        if i + 1 < len(engine_args) and not engine_args[i + 1].startswith("-"):
            keys[key], i = engine_args[i + 1], i + 2
        else:
            keys[key], i = "true", i + 1
    ini = root / f"router-{n}.ini"
    ini.write_text("version = 1\n\n[tiny]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
    return ini


async def call(bus: MessageBus, member: str, name: str) -> None:
    reply = await bus.call(Message(destination=BUS_NAME, path=OBJECT_PATH,
                                   interface=MANAGER_INTERFACE, member=member, signature="s",
                                   body=[name]))
    assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply.body


async def healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url + "/health") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def started(address: str, gateway: str, name: str, urls: list[str]) -> None:
    """StartPreset, then until the gateway sees every engine ready and each answers."""
    bus = await MessageBus(bus_address=address, bus_type=BusType.SESSION).connect()
    try:
        await call(bus, "StartPreset", name)
    finally:
        bus.disconnect()
    deadline = time.monotonic() + 180
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"{gateway}/v1/models/{name}") as r:
                lokid = (await r.json()).get("lokid", {})
            engines = lokid.get("engines", [{"state": lokid.get("state")}])
            if len(engines) == len(urls) and all(e["state"] == "ready" for e in engines) \
                    and all([await healthy(session, u) for u in urls]):
                return
            await asyncio.sleep(0.3)
    raise SystemExit(f"{name}: its {len(urls)} engines not ready in 180 s")


async def stopped(address: str, name: str, urls: list[str]) -> None:
    """StopPreset (every replica with it), then until no engine's port answers."""
    bus = await MessageBus(bus_address=address, bus_type=BusType.SESSION).connect()
    try:
        await call(bus, "StopPreset", name)
    finally:
        bus.disconnect()
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if not any([await healthy(session, u) for u in urls]):
                return
            await asyncio.sleep(0.3)
    raise SystemExit(f"{name}: an engine still answers 60 s after StopPreset")


async def converse(target: Callable[[], str], inflight: dict[str, int], model: str,
                   conversations: list[int], clients: int, system: str, tokens: int,
                   label: str) -> tuple[Run, float]:
    """The workload (as benchmarks/affinity_peers.py sends it): ``clients`` clients take
    conversations off one queue and send their turns one after another, each with the
    whole history; ``target`` picks each request's URL, the in-flight counts it may read
    kept in ``inflight`` (each URL's requests in flight). Returns the figures and the wall time."""
    side = Run()
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for c, turns in enumerate(conversations):
        queue.put_nowait((c, turns))

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            c, turns = queue.get_nowait()
            messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
            for k in range(1, turns + 1):
                messages.append({"role": "user", "content": f"Customer {label}-{c} asks "
                                 f"question {k}: where is my order {c * 100 + k}?"})
                url = target()
                inflight[url] = inflight.get(url, 0) + 1
                t = time.perf_counter()
                try:
                    async with session.post(url + "/v1/chat/completions", json={
                            "model": model, "messages": messages, "max_tokens": tokens,
                            "temperature": 0}) as r:
                        body = await r.json(content_type=None)
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                finally:
                    inflight[url] -= 1
                if not ok:
                    side.failed += 1
                    break
                side.times.append(time.perf_counter() - t)
                side.prompt_n += body["timings"]["prompt_n"]
                side.cache_n += body["timings"]["cache_n"]
                side.requests.append((c, k, body["timings"]["prompt_n"] +
                                      body["timings"]["cache_n"], body["timings"]["cache_n"]))
                messages.append({"role": "assistant", "content": f"Answer {k} to {c}."})

    began = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return side, time.perf_counter() - began


def targets(rule: str, gateway: str, replicas: list[str], inflight: dict[str, int]
            ) -> Callable[[], str]:
    """Where each request of ``rule`` goes: the gateway (or the router) for all, the
    replicas' ports in turn, or the replica with the fewest of this client's requests in
    flight (the first of those tied)."""
    if rule in ("affinity", ONE, "router"):
        return lambda: gateway
    if rule == "round-robin":
        turn = [0]

        def next_one() -> str:
            turn[0] += 1
            return replicas[turn[0] % len(replicas)]
        return next_one
    return lambda: min(replicas, key=lambda u: inflight.get(u, 0))


async def warm(url: str, model: str) -> None:
    """One request: the router loads its engine on the first one it is asked."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as session:
        async with session.post(url + "/v1/chat/completions", json={
                "model": model, "max_tokens": 1,
                "messages": [{"role": "user", "content": "Hi"}]}) as r:
            if r.status != 200:
                raise SystemExit(f"router: {r.status} {await r.text()}")


def run_rule(rule: str, n: int, ctx: dict[str, Any], system: str, label: str
             ) -> tuple[Run, float]:
    """One rule's run on fresh engines: the router started for it, or N replicas of the
    preset (one for ``affinity x1``) started and stopped after."""
    args, inflight = ctx["args"], dict[str, int]()
    if rule == "router":
        port = free_port()
        ini = router_ini(ctx["root"], n, ctx["engine_args"])
        with router_process(ini, port, ctx["root"] / f"router-{n}-{label}.log"):
            url = f"http://127.0.0.1:{port}"
            asyncio.run(warm(url, "tiny"))
            return asyncio.run(converse(lambda: url, inflight, "tiny", ctx["conversations"],
                                        args.clients, system, args.tokens, label))
    count = 1 if rule == ONE else n
    name, first = preset_name(count), ctx["ports"][count]
    replicas = [f"http://127.0.0.1:{first + k}" for k in range(count)]
    asyncio.run(started(ctx["address"], ctx["gateway"], name, replicas))
    try:
        return asyncio.run(converse(targets(rule, ctx["gateway"], replicas, inflight),
                                    inflight, name, ctx["conversations"], args.clients,
                                    system, args.tokens, label))
    finally:
        asyncio.run(stopped(ctx["address"], name, replicas))


def table(n: int, sides: dict[str, tuple[Run, float]], clients: int) -> None:
    rr = sides.get("round-robin", next(iter(sides.values())))[0]
    print(f"\n{n} replicas ({SLOTS} slots each; router: one engine of {SLOTS * n} slots)")
    print(f"{'rule':12} {'evaluated':>10} {'÷ rr':>6} {'cached':>9} {'hits':>6} "
          f"{'p50 ms':>8} {'÷ rr':>6} {'p95 ms':>8} {'req/s':>6} {'failed':>6}")
    for rule in (r for r in (*RULES, ONE) if r in sides):
        s, wall = sides[rule]
        hits = s.cache_n / max(1, s.cache_n + s.prompt_n)
        ratio = pct(s.times, 50) / pct(rr.times, 50) if s.times and rr.times else 0.0
        print(f"{rule:12} {s.prompt_n:10d} {s.prompt_n / max(1, rr.prompt_n):6.2f} "
              f"{s.cache_n:9d} {hits:6.1%} {pct(s.times, 50) * 1e3 if s.times else 0:8.1f} "
              f"{ratio:6.2f} {pct(s.times, 95) * 1e3 if s.times else 0:8.1f} "
              f"{len(s.times) / wall:6.2f} {s.failed:6d}")
    busy = min(SLOTS * n, clients, len({c for c, *_ in rr.requests}))
    floor = ideal(rr, busy)
    print(f"{'ideal':12} {floor:10d} {floor / max(1, rr.prompt_n):6.2f}   (a perfect cache: "
          f"{busy} slots read the system prompt once)")
    if "affinity" in sides and "round-robin" in sides:
        aff = sides["affinity"][0]
        hits = aff.cache_n / max(1, aff.cache_n + aff.prompt_n)
        print(f"affinity: evaluated {aff.prompt_n / max(1, rr.prompt_n):.2f} x round-robin's "
              f"(goal <= 0.25), cache hits {hits:.1%} (goal >= 90 %), answer p50 "
              f"{pct(aff.times, 50) / pct(rr.times, 50):.2f} x round-robin's (goal <= 0.4)")
    if "affinity" in sides and ONE in sides:
        (two, t2), (one, t1) = sides["affinity"], sides[ONE]
        cores = os.cpu_count() or 1
        ratio = (len(two.times) / t2) / max(1e-9, len(one.times) / t1)
        print(f"throughput: 2 replicas {ratio:.2f} x one replica's requests/s (goal >= 1.8 "
              f"where the cores allow it); {cores} CPUs" +
              (": each engine's threads already use them all, so a second replica adds "
               "no compute here and cannot show it" if cores < 2 * 2 else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--replicas", default="2,4", help="replica counts, comma-separated")
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--turns", default="6-10", help="turns of a conversation, MIN-MAX")
    p.add_argument("--system", type=int, default=1500, help="system prompt, in tokens")
    p.add_argument("--tokens", type=int, default=4, help="tokens of each answer")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rules", default=",".join(RULES),
                   help="the rules to run, of: " + ", ".join(RULES))
    p.add_argument("--no-one", action="store_true",
                   help="without the affinity x1 run (1 replica vs 2)")
    p.add_argument("--engine-args", default="[]",
                   help='a JSON list added to every engine\'s arguments, e.g. ["-sps", "0.5"]')
    args = p.parse_args()
    chosen = [r.strip() for r in args.rules.split(",")]
    if not set(chosen) <= set(RULES):
        p.error(f"--rules: of {', '.join(RULES)}")
    engine_args = json.loads(args.engine_args)
    if not (isinstance(engine_args, list) and all(isinstance(a, str) for a in engine_args)):
        p.error("--engine-args: a JSON list of strings")
    counts = [int(x) for x in args.replicas.split(",")]
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    rng = random.Random(seed)
    low, high = (int(x) for x in args.turns.split("-"))
    conversations = [rng.randint(low, high) for _ in range(args.conversations)]
    plans = {}
    for n in counts:
        plans[n] = list(chosen) + ([ONE] if n == 2 and "affinity" in chosen
                                   and not args.no_one else [])
        rng.shuffle(plans[n])
    with tempfile.TemporaryDirectory(prefix="lokid-affinity-") as tmp:
        root = Path(tmp)
        config, ports = write_host(root, sorted({*counts, 1}), engine_args)
        gport = free_port()
        with daemon_process(config, root) as daemon, \
                gateway_process(config, daemon.address, gport):
            print(f"load average at start: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; "
                  f"seed {seed}; {args.conversations} conversations of {args.turns} turns "
                  f"({sum(conversations)} requests a rule), {args.clients} clients, a "
                  f"{args.system}-token system prompt, answers of {args.tokens} tokens; "
                  f"engine args {engine_args}; fresh engines for each rule")
            ctx = {"args": args, "root": root, "engine_args": engine_args, "ports": ports,
                   "conversations": conversations, "address": daemon.address,
                   "gateway": f"http://127.0.0.1:{gport}"}
            results: dict[int, dict[str, tuple[Run, float]]] = {}
            for n in counts:
                print(f"{n} replicas, rules in the order run: {', '.join(plans[n])}")
                results[n] = {}
                for rule in plans[n]:
                    index = n * 10 + (*RULES, ONE).index(rule)
                    results[n][rule] = run_rule(rule, n, ctx, system_prompt(index, args.system),
                                                str(index))
                    s, wall = results[n][rule]
                    print(f"  {rule}: {wall:.1f} s, {len(s.times)} answered, load "
                          f"{os.getloadavg()[0]:.2f}", flush=True)
    for n in counts:
        table(n, results[n], args.clients)
    failed = sum(s.failed for r in results.values() for s, _ in r.values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
