#!/usr/bin/env python3
"""The walk of issue 45, from the Debian package under real systemd, printed: first as
an attacker, then as an operator with journald's default rate limits.

Not a test (each rule has its own under tests/): what an attacker gets and what an
operator sees, on a Debian 13 container booted with real systemd, lokid's .deb and
Debian's prometheus-node-exporter installed by apt, the real CPU engine, tiny generated
models. Presets: ``a`` and ``b`` share the GPU group ``g`` (a swap saves and restores
their slots under /var/lib/loki/slots), ``c`` alone; all on demand behind the gateway,
which has one peer: scripts/lying_peer.py, whose answers the walk changes.

0. a fresh install: the shipped example preset, node_exporter's lokid metrics, whether
   the shipped LokidPresetBroken alert's expression holds;
1. the attacker (scripts/trust_probes.py, Debian's python3 in the container):
   silent connections; the peer's huge, deep, many, malformed and lying listings (the
   gateway's memory, /health p99 beside them, /v1/models, its log); a page's <img>
   (``GET /props?model=`` for a stopped preset and for the other member of a group) and a
   rebinding ``Host``; malformed requests and resets (the gateway's log lines); gzip
   bombs; a request the peer takes and drops; a local user at an RPC worker's port;
2. the operator: 8 client threads over a, b, c for ``--seconds`` with journald's
   default limits, every request counted by the clients, the gateway and the engines'
   journal (Stats); /var/lib/loki filled (a 48 MiB tmpfs) and freed during swaps
   (engine aborts, notes); a busy engine stopped; a preset that never fits (its engine
   cannot allocate: LimitAS=600M, as scripts/walk_placement.py does).

    .venv/bin/python scripts/walk_trust.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.debpkg import cached_build, runtime_packages  # noqa: E402
from support.enginekit import engine_binary, free_port  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

SUITE = "trixie"
ENGINE_DIR = "/opt/engine"
MODEL_DIR = "/srv/models"
PROBE = "/root/trust_probes.py"
PEER = "/root/lying_peer.py"
MODE = "/root/peer.mode"
PRESETS = ("a", "b", "c")


def say(text: str) -> None:
    print(text, flush=True)


def run(ct: Container, *argv: str, timeout: float = 600) -> str:
    r = ct.run(list(argv), check=False, timeout=timeout)
    return (r.stdout + r.stderr).rstrip()


def probe(ct: Container, *args: str, timeout: float = 600) -> dict:
    out = run(ct, "python3", PROBE, *args, timeout=timeout)
    try:
        return json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": out[-600:]}


def chat(ct: Container, port: int, model: str, tokens: int = 8, stream: bool = False,
         host: str = "127.0.0.1") -> tuple[int, float, str]:
    body = json.dumps({"model": model, "max_tokens": tokens, "temperature": 0,
                       "stream": stream,
                       "messages": [{"role": "user", "content": "Hello there"}]})
    t0 = time.monotonic()
    r = ct.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-m", "300",
                "-H", "Content-Type: application/json", "-H", f"Host: {host}", "-d", body,
                f"http://127.0.0.1:{port}/v1/chat/completions"], check=False, timeout=310)
    text, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), time.monotonic() - t0, text


def get(ct: Container, port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    r = ct.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-m", "60",
                "-H", f"Host: {host}", f"http://127.0.0.1:{port}{path}"], check=False,
               timeout=70)
    text, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), text


def cursor(ct: Container) -> str:
    return run(ct, "journalctl", "-n", "0", "--show-cursor", "-q").split()[-1]


def lines_since(ct: Container, after: str, *units: str) -> list[str]:
    argv = ["journalctl", "--no-pager", "-q", "-o", "cat", "--after-cursor", after]
    for u in units:
        argv += ["-u", u]
    return [x for x in run(ct, *argv).splitlines() if x.strip()]


def gateway_memory(ct: Container) -> str:
    pid = run(ct, "systemctl", "show", "-P", "MainPID", "loki-gateway.service")
    status = run(ct, "cat", f"/proc/{pid}/status")
    keep = dict(x.split(":", 1) for x in status.splitlines()
                if x.startswith(("VmRSS:", "VmHWM:")))
    fds = run(ct, "sh", "-c", f"ls /proc/{pid}/fd | wc -l")
    return f"RSS {keep.get('VmRSS', '?').strip()}, peak {keep.get('VmHWM', '?').strip()}, " \
           f"{fds} descriptors"


def active(ct: Container, unit: str) -> str:
    return run(ct, "systemctl", "is-active", unit)


def stats_counts(ct: Container, since: str) -> tuple[dict[str, int], int, bool]:
    """The gateway's answers by status code (Stats' gateway_requests, since the daemon
    started), and the requests the engines' journal shows since ``since`` over every
    start of a, b, c (``lokictl stats --since``: a swap starts an engine again, and
    Stats' own count is the current start's), and whether lokid said that count is a
    lower bound (journald dropped lines)."""
    answers: dict[str, int] = {}
    requests = 0
    lower = False
    for name in PRESETS:
        try:
            stats = json.loads(run(ct, "lokictl", "stats", name, "--json"))
            window = json.loads(run(ct, "lokictl", "stats", name, "--since", since,
                                    "--json"))
        except ValueError:
            continue
        for code, n in (stats.get("gateway_requests") or {}).items():
            answers[code] = answers.get(code, 0) + int(n)
        requests += int(window.get("requests") or 0)
        lower = lower or bool(window.get("requests_lower_bound"))
    return answers, requests, lower


def boot(work: Path) -> tuple[Container, int, int]:
    b = cached_build(SUITE, work / "deb")
    if b.rc != 0:
        raise SystemExit(b.log[-4000:])
    for name in PRESETS:
        write_llama(work / f"{name}.gguf", n_layers=4, n_embd=256, n_head=4, n_head_kv=4,
                    n_ff=512, seed=ord(name))
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary())}
    ct = Container(suite=SUITE, packages=runtime_packages(SUITE), binds=binds)
    ct.start()
    t0 = time.monotonic()
    run(ct, "apt-get", "-q", "-y", "update")
    out = ct.run(["apt-get", "-q", "-y", "install", f"/debs/{b.deb.name}",
                  "prometheus-node-exporter"], check=False, timeout=900,
                 env={"DEBIAN_FRONTEND": "noninteractive"})
    if out.returncode != 0:
        ct.stop()
        raise SystemExit(out.stdout[-3000:] + out.stderr)
    say(f"=== 0. fresh install (lokid + prometheus-node-exporter by apt): "
        f"{time.monotonic() - t0:.0f} s ===")
    for name in PRESETS:
        ct.write_file(f"{MODEL_DIR}/{name}.gguf", (work / f"{name}.gguf").read_bytes())
    ct.write_file(PROBE, (ROOT / "scripts" / "trust_probes.py").read_bytes())
    ct.write_file(PEER, (ROOT / "scripts" / "lying_peer.py").read_bytes())
    return ct, free_port(), free_port()


def fresh_install(ct: Container) -> None:
    time.sleep(20)
    say("$ lokictl presets\n" + run(ct, "lokictl", "presets"))
    say("node_exporter's lokid_preset_broken: " + " ".join(
        x for x in run(ct, "curl", "-s", "http://127.0.0.1:9100/metrics").splitlines()
        if x.startswith("lokid_preset_broken")) or "(none)")
    rules = run(ct, "sh", "-c", "grep -rA3 'alert: LokidPresetBroken' "
                "/usr/share/doc/lokid /usr/share/lokid /etc/prometheus 2>/dev/null | head -8")
    say("the shipped alert: " + (rules or "(not found in the package)"))
    say("lokid.toml on model_dirs: " + run(ct, "grep", "-B2", "model_dirs", "/etc/loki/lokid.toml"))


def configure(ct: Container, port: int, peer_port: int) -> None:
    ct.write_file(MODE, "ok\n")
    run(ct, "systemd-run", "--unit=lying-peer", "python3", PEER, str(peer_port), MODE)
    ct.write_file("/etc/loki/lokid.toml",
                  f'engine = "{ENGINE_DIR}/{os.path.basename(engine_binary())}"\n'
                  f'model_dirs = ["{MODEL_DIR}"]\n'
                  f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n'
                  f'peers = [{{ url = "http://127.0.0.1:{peer_port}" }}]\n')
    run(ct, "rm", "-f", "/etc/loki/presets/example.toml")
    for name in PRESETS:
        group = 'group = "g"\n' if name in ("a", "b") else ""
        ctx = 16384 if name == "c" else 2048   # c streams long enough to be stopped
        ct.write_file(f"/etc/loki/presets/{name}.toml",
                      f'model = "{name}.gguf"\nctx = {ctx}\n'
                      f"port = {free_port()}\n[serve]\non_demand = true\n{group}")
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service", timeout=120)
    ct.systemctl("start", "loki-gateway.socket", "sockets.target")
    time.sleep(3)


def attacker(ct: Container, port: int) -> None:
    say("\n=== 1. the attacker ===")
    get(ct, port, "/health")
    say(f"gateway at rest: {gateway_memory(ct)}")
    say("\n-- 1a. 3,000 connections that send nothing (Debian 13's aiohttp) --")
    res = probe(ct, "silent", str(port), "3000", "200")
    for row in res.get("timeline", [])[:3] + res.get("timeline", [])[-2:]:
        say(f"  {row}")
    say(f"  opened {res.get('opened')}, refused {res.get('refused')}; after: "
        f"{gateway_memory(ct)}")

    say("\n-- 1b. the peer lies --")
    for mode in ("huge", "deep", "many", "malformed", "claim a", "ok"):
        at = cursor(ct)
        ct.write_file(MODE, mode + "\n")
        time.sleep(12)
        h = probe(ct, "health", str(port), "300")
        code, models = get(ct, port, "/v1/models")
        try:
            ids = [m["id"] for m in json.loads(models)["data"]]
        except (ValueError, KeyError, TypeError):
            ids = []
        logged = [x for x in lines_since(ct, at, "loki-gateway.service") if "peer" in x]
        say(f"  {mode}: {gateway_memory(ct)}; /health p50 {h.get('p50_ms')} ms p99 "
            f"{h.get('p99_ms')} ms; /v1/models {code}, {len(ids)} models, "
            f"peer address in it: {'10.9.8.7' in models}; log: "
            f"{logged[-1][:160] if logged else '(nothing)'} ({len(logged)} lines)")
        if mode == "claim a":
            r = chat(ct, port, "a")
            posts = run(ct, "sh", "-c", f"cat {MODE}.posts 2>/dev/null | wc -l")
            say(f"  a request for this host's own a while the peer claims it: {r[0]}; "
                f"requests the peer received: {posts}")

    say("\n-- 1c. a web page: <img src=.../props?model=X>, a rebinding Host --")
    run(ct, "systemctl", "stop", "loki-engine@a", "loki-engine@b", "loki-engine@c")
    code, text = get(ct, port, "/props?model=c")
    say(f"  GET /props?model=c (stopped): {code} {text[:160]}; engine c: "
        f"{active(ct, 'loki-engine@c')}")
    chat(ct, port, "a")
    code, text = get(ct, port, "/props?model=b")
    say(f"  a running, GET /props?model=b (same group): {code} {text[:160]}; a "
        f"{active(ct, 'loki-engine@a')}, b {active(ct, 'loki-engine@b')}")
    for host in ("attacker.example", "attacker.example:" + str(port), "localhost",
                 f"127.0.0.1:{port}"):
        code, text = get(ct, port, "/v1/models", host)
        say(f"  GET /v1/models with Host: {host}: {code} {text[:100] if code != 200 else ''}")
    r = chat(ct, port, "c", host="attacker.example")
    say(f"  POST chat with Host: attacker.example: {r[0]} {r[2][:120]}")

    say("\n-- 1d. 2,000 malformed requests, 200 resets mid-body: the gateway's log --")
    at = cursor(ct)
    m = probe(ct, "malformed", str(port), "2000")
    rs = probe(ct, "reset", str(port), "200")
    time.sleep(2)
    logged = lines_since(ct, at, "loki-gateway.service")
    tracebacks = sum("Traceback" in x for x in logged)
    say(f"  {m}; resets {rs}; gateway log: {len(logged)} lines, "
        f"{sum(len(x) for x in logged)} bytes, {tracebacks} tracebacks")
    for x in logged[:6]:
        say(f"    {x[:200]}")

    say("\n-- 1e. gzip bombs (64 KiB inflating to 62 MiB) --")
    at = cursor(ct)
    say(f"  one to c: {probe(ct, 'bomb', str(port), '1', 'c')}; "
        f"engine c's lines since: {len(lines_since(ct, at, 'loki-engine@c.service'))}")
    say(f"  eight at once: {probe(ct, 'bomb', str(port), '8', 'c')}; {gateway_memory(ct)}")

    say("\n-- 1f. the peer takes a request and drops it --")
    ct.write_file(MODE, "claim peer-only\n")
    time.sleep(6)
    run(ct, "rm", "-f", MODE + ".posts")
    r = chat(ct, port, "peer-only")
    posts = run(ct, "sh", "-c", f"cat {MODE}.posts 2>/dev/null | wc -l")
    say(f"  the client: {r[0]} {r[2][:160]}; times the peer received it: {posts}")
    ct.write_file(MODE, "ok\n")

    say("\n-- 1g. a local user at an RPC worker's port --")
    rpc_port = free_port()
    ct.write_file("/etc/loki/rpc/w.toml", f'listen = "127.0.0.1:{rpc_port}"\n'
                  'heads = ["127.0.0.2"]\n')
    ct.systemctl("daemon-reload")
    run(ct, "systemctl", "start", "loki-rpc@w.service")
    time.sleep(3)
    say("  the unit's fence: " + run(ct, "systemctl", "show", "-p", "IPAddressAllow", "-p",
                                     "IPAddressDeny", "loki-rpc@w.service").replace("\n", " "))
    for source in ("127.0.0.1", "127.0.0.2"):
        hello = run(ct, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    "python3", "-c",
                    "import socket\ntry:\n socket.create_connection(('127.0.0.1', "
                    + str(rpc_port) + f"), timeout=5, source_address=('{source}', 0))\n"
                    " print('connected')\nexcept OSError as e:\n print('not connected:', e)")
        say(f"  user nobody from {source} to the worker (127.0.0.1:{rpc_port}): "
            f"{hello.splitlines()[-1][:160] if hello else '?'}")
    run(ct, "systemctl", "stop", "loki-rpc@w.service")


def team_load(ct: Container, port: int, seconds: float) -> None:
    say(f"\n=== 2a. 8 client threads over a, b, c for {seconds:.0f} s, journald's default "
        "limits ===")
    run(ct, "rm", "-f", "/etc/systemd/journald.conf.d/lokid-harness.conf")
    run(ct, "systemctl", "restart", "systemd-journald.service")
    time.sleep(3)
    since = run(ct, "date", "+%Y-%m-%d %H:%M:%S")
    before, _, _ = stats_counts(ct, since)
    at = cursor(ct)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            name = rng.choices(PRESETS, [3, 2, 4])[0]
            code, _, _ = chat(ct, port, name, rng.randint(2, 12), stream=rng.random() < 0.5)
            with lock:
                counts[str(code)] = counts.get(str(code), 0) + 1
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    time.sleep(5)
    after, journal, lower = stats_counts(ct, since)
    counted = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    say(f"the clients' answers: {counts} ({sum(counts.values())} requests)")
    say(f"the gateway's count (Stats gateway_requests): {counted}")
    say(f"the engines' journal (lokictl stats --since, over every start): {journal}"
        + (" (said to be a lower bound)" if lower else ""))
    supp = run(ct, "journalctl", "--no-pager", "-q", "-o", "cat", "--after-cursor", at,
               "MESSAGE_ID=a596d6fe7bfa4994828e72309e95d61e").splitlines()
    say(f"journald suppressed: {supp[-3:] or 'nothing'}")
    engine_lines = run(ct, "journalctl", "--no-pager", "-q", "-o", "cat", "--since", since,
                       "-u", "loki-engine@a", "-u", "loki-engine@b", "-u", "loki-engine@c")
    n = max(1, sum(counts.values()))
    say(f"the engines' journal lines meanwhile: {len(engine_lines.splitlines())} "
        f"({len(engine_lines.splitlines()) / n:.1f} per request, "
        f"{len(engine_lines.encode()) / n:.0f} bytes of text per request, starts included)")
    say("journal: " + run(ct, "journalctl", "--disk-usage"))


def full_disk(ct: Container, port: int) -> None:
    say("\n=== 2b. /var/lib/loki filled and freed during swaps ===")
    run(ct, "sh", "-c", "systemctl stop loki-gateway.socket loki-gateway.service "
        "'loki-engine@*' lokid.service; cp -a /var/lib/loki /var/lib/loki.disk && "
        "mount -t tmpfs -o size=48M,mode=0755 tmpfs /var/lib/loki && "
        "cp -a /var/lib/loki.disk/. /var/lib/loki/ && chown loki:loki /var/lib/loki")
    ct.systemctl("start", "lokid.service", "loki-gateway.socket", timeout=120)
    time.sleep(3)
    for name in ("a", "b", "a", "b"):
        chat(ct, port, name, 4)
    say("slots saved: " + run(ct, "sh", "-c", "ls -la /var/lib/loki/slots/*/ | head -12"))
    run(ct, "sh", "-c", "fallocate -l 64M /var/lib/loki/filler 2>/dev/null || "
        "dd if=/dev/zero of=/var/lib/loki/filler bs=1M 2>/dev/null; df -h /var/lib/loki")
    say(run(ct, "df", "-h", "/var/lib/loki"))
    at = cursor(ct)
    codes: dict[int, int] = {}
    for i in range(40):
        code, _, _ = chat(ct, port, "ab"[i % 2], 4)
        codes[code] = codes.get(code, 0) + 1
    logged = lines_since(ct, at, "loki-engine@a.service", "loki-engine@b.service")
    aborts = sum("GGML_ASSERT" in x or "core-dump" in x or "status=134" in x for x in logged)
    say(f"40 alternating requests on a full disk: {codes}; engine abort lines: {aborts}")
    say("$ lokictl presets (disk full)\n" + run(ct, "lokictl", "presets"))
    run(ct, "rm", "-f", "/var/lib/loki/filler")
    at = cursor(ct)
    codes = {}
    for i in range(20):
        code, _, _ = chat(ct, port, "ab"[i % 2], 4)
        codes[code] = codes.get(code, 0) + 1
    logged = lines_since(ct, at, "loki-engine@a.service", "loki-engine@b.service")
    aborts = sum("GGML_ASSERT" in x or "core-dump" in x or "status=134" in x for x in logged)
    say(f"freed, 20 more: {codes}; engine abort lines: {aborts}")
    time.sleep(3)
    say("$ lokictl presets (freed)\n" + run(ct, "lokictl", "presets"))
    say("notes naming the disk: " + (run(ct, "sh", "-c", "lokictl status a b c 2>&1 | "
                                         "grep -i 'space\\|cannot be written' || true")
                                     or "none"))
    run(ct, "sh", "-c", "systemctl stop loki-gateway.socket loki-gateway.service "
        "'loki-engine@*' lokid.service; umount /var/lib/loki; rm -rf /var/lib/loki.disk")
    ct.systemctl("start", "lokid.service", "loki-gateway.socket", timeout=120)
    time.sleep(3)


def busy_stop(ct: Container, port: int) -> None:
    say("\n=== 2c. a busy engine stopped ===")
    chat(ct, port, "c", 2)
    result: list[tuple[int, float, str]] = []
    t = threading.Thread(target=lambda: result.append(chat(ct, port, "c", 12000, stream=True)))
    t.start()
    time.sleep(2)
    t0 = time.monotonic()
    run(ct, "systemctl", "stop", "loki-engine@c.service")
    took = time.monotonic() - t0
    t.join()
    code, _, text = result[0]
    say(f"systemctl stop took {took:.1f} s; the client's stream: {code}, ends with "
        f"{text.strip()[-160:]!r}")
    say(run(ct, "journalctl", "-u", "loki-engine@c.service", "-n", "6", "-o", "cat",
            "--no-pager"))


def never_fits(ct: Container, port: int) -> None:
    say("\n=== 2d. a preset that never fits (an engine that cannot allocate: LimitAS=600M) ===")
    ct.write_file("/etc/loki/presets/big.toml",
                  f'model = "c.gguf"\nctx = 1000000\nport = {free_port()}\n'
                  'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    ct.write_file("/etc/systemd/system/loki-engine@big.service.d/limit.conf",
                  "[Service]\nLimitAS=600M\n")
    ct.systemctl("daemon-reload")
    run(ct, "lokictl", "reload")
    time.sleep(2)
    row = [x for x in run(ct, "lokictl", "presets").splitlines() if x.startswith("big ")]
    m = re.search(r"host ([\d.]+)([MG])", row[0] if row else "")
    need = float(m.group(1)) * (1024 if m and m.group(2) == "G" else 1) if m else 2048.0
    say(f"big's estimate: {need:.0f} MiB; host_memory set to {need + 40:.0f} MiB (a and c "
        "must make room)")
    run(ct, "sh", "-c", f"printf '[placement]\\nhost_memory = \"{need + 40:.0f}M\"\\n' "
        ">> /etc/loki/lokid.toml")
    ct.systemctl("restart", "lokid.service", timeout=120)
    ct.systemctl("restart", "loki-gateway.service", timeout=120)
    time.sleep(3)
    at = cursor(ct)
    for i in range(4):
        for name in ("a", "c"):
            chat(ct, port, name, 2)
        code, took, text = chat(ct, port, "big", 2)
        say(f"request {i + 1} to big (after a and c were asked): {code} in {took:.1f} s: "
            f"{text[:300]}")
    logged = lines_since(ct, at, "loki-gateway.service", "lokid.service")
    starts = len([x for x in lines_since(ct, at, "loki-engine@big.service")
                  if "Starting" in x])
    say(f"engine big started {starts} times; gateway/daemon lines naming an eviction: "
        f"{sum('evict' in x.lower() for x in logged)}")
    for x in [x for x in logged if "big" in x][-8:]:
        say(f"    {x[:220]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated: "
                    "attacker, load, disk, stop, fit")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        ct, port, peer_port = boot(Path(tmp))
        try:
            fresh_install(ct)
            configure(ct, port, peer_port)
            if "attacker" not in skip:
                attacker(ct, port)
            if "load" not in skip:
                team_load(ct, port, args.seconds)
            if "disk" not in skip:
                full_disk(ct, port)
            if "stop" not in skip:
                busy_stop(ct, port)
            if "fit" not in skip:
                never_fits(ct, port)
        finally:
            ct.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
