#!/usr/bin/env python3
"""An on-demand preset's own port (systemd-socket-proxyd) against the engine directly,
side by side in one run (issue 22, item 4: goal >= 98 % throughput).

What a ``loki-port@<preset>.socket`` plus ``loki-port@<preset>.service`` do under
systemd, set up on the host as ``../shared/recipes/README.md`` did: the real
llama-server b11434 on a UNIX socket (``--host x.sock``, as lokid plans an on-demand
preset's engine under systemd), and ``systemd-socket-activate -l 127.0.0.1:P
systemd-socket-proxyd x.sock`` relaying a TCP port to it. Beside it a second engine,
the same model and flags, on a TCP port of its own: what a client of a preset that is
not on demand reaches. Measured interleaved (only one side busy at a time, the other
engine idle), so the sides see the same moments of the machine's load:

- tcp: the client on the second engine's TCP port (the engine directly, as before);
- relay: the client on the on-demand port, through systemd-socket-proxyd;
- unix: the client on the first engine's UNIX socket (the relay's own far end).

Measured: one request at a time on a keep-alive connection (a chat completion of one
token, ``--requests`` rounds of each side): p50 and p99; then ``--rounds`` rounds of 16
concurrent chat completions of ``--tokens`` tokens (``ignore_eos``) on each side,
streamed (one chunk per token: the relay's worst case) and not streamed (one reply per
request): tokens/s, the time to first token, and the relay's share of tcp; and the
relay's own CPU time per streamed token (its /proc counters), which says what it costs
where the engine's tokens come from a GPU rather than from these CPUs.

The client is one aiohttp process for both sides. On a machine with few CPUs the client,
the relay and the engine share them: the figures are the relay's cost there, all included.

Measured on the 2-CPU machine of issue 22 (shared with other work, load 2-3), two runs:
not streamed, relay / tcp 103.6 % and 100.3 % (goal >= 98 %: met); streamed (the tiny
engine emits ~5,000 chunks a second, each one relayed on the same two CPUs as the
engine and the client), 81.3 % and 77.2 % (not met there), first token +0.5 / -1.9 ms;
one request at a time p50 +0.24 / +1.0 ms over tcp. The relay spends 24 us of CPU per
streamed token: at 16 streams of 100 tokens/s, what a GPU engine gives, 3.9 % of one CPU.

    .venv/bin/python benchmarks/port_relay.py [--requests 500] [--rounds 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from support.enginekit import engine_binary, free_port  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.openai_load import STREAMS, chat, concurrent, one, pct  # noqa: E402

PROXYD = ("/usr/lib/systemd/systemd-socket-proxyd", "/lib/systemd/systemd-socket-proxyd")


async def wait_health(session: aiohttp.ClientSession, url: str, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not answer /health in 60 s")
        await asyncio.sleep(0.05)


async def bulk(session: aiohttp.ClientSession, url: str, tokens: int) -> float:
    """Tokens/s of 16 concurrent completions not streamed."""
    async def post() -> int:
        async with session.post(url + "/v1/chat/completions", json=chat(tokens)) as r:
            assert r.status == 200, r.status
            return int((await r.json())["usage"]["completion_tokens"])

    t = time.perf_counter()
    got = await asyncio.gather(*(post() for _ in range(STREAMS)))
    return sum(got) / (time.perf_counter() - t)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and of its children (the relay:
    systemd-socket-activate runs systemd-socket-proxyd, as its child or in its place)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:   # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def measure(sock: str, port: int, tcp_port: int, requests: int, rounds: int,
                  tokens: int, relay_pid: int) -> None:
    url = "http://localhost"      # the UNIX connector ignores the host
    relay = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as unix, \
            aiohttp.ClientSession() as tcp_session:
        sides = {"tcp": (tcp_session, f"http://127.0.0.1:{tcp_port}"),
                 "relay": (tcp_session, relay), "unix": (unix, url)}
        await wait_health(unix, url, "the engine on its socket")
        await wait_health(tcp_session, sides["tcp"][1], "the engine on TCP")
        t = time.perf_counter()
        await wait_health(tcp_session, relay, "the relay")
        print(f"first request through the relay (systemd-socket-proxyd spawned on it): "
              f"{(time.perf_counter() - t) * 1000:.1f} ms")
        for _ in range(20):   # warm every path (connections, the prompt cache)
            for session, base in sides.values():
                await one(session, base)
        lat: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(requests):
            for name, (session, base) in sides.items():
                lat[name].append(await one(session, base))
        print(f"\none request at a time, {requests} rounds interleaved (chat, 1 token):")
        for name, v in lat.items():
            print(f"  {name:6} p50 {pct(v, 50) * 1000:7.3f} ms   p99 {pct(v, 99) * 1000:7.3f} ms")
        print(f"  added by the relay over tcp: p50 "
              f"{(pct(lat['relay'], 50) - pct(lat['tcp'], 50)) * 1000:+.3f} ms, p99 "
              f"{(pct(lat['relay'], 99) - pct(lat['tcp'], 99)) * 1000:+.3f} ms")

        spent, carried = 0.0, 0
        for streamed in (False, True):
            rate: dict[str, list[float]] = {name: [] for name in sides}
            ttft: dict[str, list[float]] = {name: [] for name in sides}
            for session, base in sides.values():   # warm the 16 slots of both engines
                await bulk(session, base, tokens)
            for r in range(rounds):
                # rotate which side goes first: none always gets the warmer moment
                order = list(sides.items())
                order = order[r % len(order):] + order[:r % len(order)]
                for name, (session, base) in order:
                    cpu = cpu_seconds(relay_pid)
                    if streamed:
                        tps, first = await concurrent(session, base, tokens)
                        ttft[name].append(first)
                    else:
                        tps = await bulk(session, base, tokens)
                    rate[name].append(tps)
                    if name == "relay" and streamed:
                        spent += cpu_seconds(relay_pid) - cpu
                        carried += STREAMS * tokens
            how = "streamed" if streamed else "not streamed"
            print(f"\n{STREAMS} concurrent completions of {tokens} tokens, {how}, "
                  f"{rounds} rounds interleaved:")
            for name in rate:
                first_text = (f"   first token p50 {statistics.median(ttft[name]) * 1000:.2f} ms"
                              if streamed else "")
                print(f"  {name:6} {statistics.median(rate[name]):8.0f} tok/s (rounds: "
                      + ", ".join(f"{x:.0f}" for x in rate[name]) + ")" + first_text)
            share = statistics.median(rate["relay"]) / statistics.median(rate["tcp"])
            print(f"  relay / tcp tokens/s: {share:.1%} (goal >= 98 %); relay / unix: "
                  f"{statistics.median(rate['relay']) / statistics.median(rate['unix']):.1%}")
            if streamed:
                added = (statistics.median(ttft["relay"]) - statistics.median(ttft["tcp"]))
                print(f"  added time to first token over tcp, p50: {added * 1000:+.2f} ms")
                per = spent / max(carried, 1)
                print(f"  the relay's CPU: {per * 1e6:.1f} us per streamed token ({spent:.2f} s "
                      f"for {carried} tokens); at {STREAMS} streams of 100 tokens/s (a GPU "
                      f"engine) that is {per * STREAMS * 100:.1%} of one CPU")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    proxyd = next((p for p in PROXYD if os.path.exists(p)), None)
    activate = shutil.which("systemd-socket-activate")
    if proxyd is None or activate is None:
        raise SystemExit("needs systemd-socket-proxyd and systemd-socket-activate "
                         "(Debian: systemd)")
    with tempfile.TemporaryDirectory(prefix="lokid-port-bench-") as tmp:
        root = Path(tmp)
        model = write_llama(root / "tiny.gguf")
        sock, port, tcp_port = str(root / "tiny.sock"), free_port(), free_port()
        flags = ["-m", str(model), "-c", str(STREAMS * 512), "-np", str(STREAMS)]
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for argv in ([engine_binary(), *flags, "--host", sock],
                              [engine_binary(), *flags, "--host", "127.0.0.1", "--port",
                               str(tcp_port)],
                              [activate, "-l", f"127.0.0.1:{port}", proxyd, sock])]
        try:
            print(f"load average at start: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; "
                  f"relay {proxyd}")
            asyncio.run(measure(sock, port, tcp_port, args.requests, args.rounds,
                                args.tokens, procs[2].pid))
            print(f"load average at end: {os.getloadavg()[0]:.2f}")
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
