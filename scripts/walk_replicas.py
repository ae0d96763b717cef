#!/usr/bin/env python3
"""The walk of issue 47, from the Debian package under real systemd, printed: a preset's
replicas under load, an edit rolling through them, one killed mid-stream, their units,
and an attacker at them.

Not a test (each rule has its own under tests/): what an operator sees, on a Debian 13
container booted with real systemd, lokid's .deb installed by apt, the real CPU engine,
tiny generated models. Presets: ``r`` (-np 2, -t 1: each engine one core of the
host's, so that the scaling rule finds compute for as many replicas as there are
cores; on demand, idle_stop 120 s, so a replica the rule started stops after 30 s idle;
max_replicas 3) and ``s`` (-np 1, on demand).
The clients are scripts/replica_probes.py, run inside the container as transient units.

1. install, the presets, ``lokictl replica list r``;
2. 1 -> N -> 1 under load (N: 3, or the host's cores where fewer): 8 threads of
   multi-turn chats (streamed and plain) for --seconds, then one thread for TAIL
   seconds; the scaling rule's starts and stops (or ``lokictl replica start`` by
   hand where the rule started none by 40 %: said; stopped by hand where the rule has
   not 45 s after the idle time it waits for), per minute; each engine's requests
   (its journal's ``request: POST`` lines); failures by status;
3. an edit rolling through: three engines, 8 threads for --roll seconds, ``lokictl set
   r ctx=8192`` (more context, as for longer chats) and ``lokictl restart r``
   meanwhile: the engines' restarts in order (journal), the failed requests (a smaller
   context refuses the longer conversations, 400: the edit's doing, not the roll's);
4. replica 2 SIGKILLed (``systemctl kill``) while a client streams from it: the client's
   last event, its next turn's status, the unit's restart;
5. the unit ``loki-engine@r:2``: start limit, stop signal and timeout, memory bounds,
   device policy, a SIGTERM stop's time, each replica's port and what listens;
6. the attacker: replica-shaped model names at the gateway, ``lokictl replica`` and
   StartReplica/StopReplica as user nobody, hostile arguments as root.

    .venv/bin/python scripts/walk_replicas.py [--seconds 300] [--roll 60] [--skip 2,3]
        [--deb PATH | --head]

``--head`` builds the .deb from the last commit (others' uncommitted edits in the
working tree left out); ``--deb`` installs one already built.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import support.debpkg as debpkg  # noqa: E402
from support.enginekit import engine_binary, free_port, free_ports  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.systemd_harness import Container  # noqa: E402
from walk_team import run, say  # noqa: E402

SUITE = "trixie"
ENGINE_DIR = "/opt/engine"
MODEL_DIR = "/srv/models"
PROBE = "/root/replica_probes.py"
BUS = ["org.lokid.Lokid1", "/org/lokid/Lokid1", "org.lokid.Lokid1.Manager"]
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
P = "r"
IDLE_STOP = 120          # s: the rule stops a replica it started after a quarter idle
TAIL = 50                # s of one thread after the 8 threads' load: the load falls
SUMMARY: list[tuple[str, str]] = []
KILL_TOKENS = 1500       # each stream of step 4: long enough to be cut (seconds), not the
                         # 200 that one engine a core answered before the kill landed
CRASH = [2]              # the engines whose crash loop step 5 tries (--crash-loop)


def unit(k: int) -> str:
    return f"loki-engine@{P}.service" if k == 1 else f"loki-engine@{P}:{k}.service"


def build(work: Path, head: bool) -> Path:
    if head:   # the last commit, as a fresh clone of it would build
        src = work / "src"
        src.mkdir()
        subprocess.run(f"git -C {ROOT} archive HEAD | tar -x -C {src}", shell=True,
                       check=True)
        subprocess.run(["sh", "-c", "git init -q && git add ."], cwd=src, check=True)
        setattr(debpkg, "REPO", src)   # noqa: B010 (copy_tree reads it)
    b = debpkg.build_in_container(SUITE, work / "deb")
    if b.rc != 0:
        raise SystemExit(b.log[-4000:])
    return Path(b.deb)


def boot(work: Path, deb: Path) -> Container:
    for name in (P, "s"):
        write_llama(work / f"{name}.gguf", n_layers=4, n_embd=256, n_head=4, n_head_kv=4,
                    n_ff=512, seed=ord(name))
    binds = {"/debs": str(deb.parent), ENGINE_DIR: os.path.dirname(engine_binary())}
    ct = Container(suite=SUITE, packages=debpkg.runtime_packages(SUITE), binds=binds)
    ct.start()
    t0 = time.monotonic()
    run(ct, "apt-get", "-q", "-y", "update")
    out = ct.run(["apt-get", "-q", "-y", "install", f"/debs/{deb.name}"], check=False,
                 timeout=900, env={"DEBIAN_FRONTEND": "noninteractive"})
    if out.returncode != 0:
        ct.stop()
        raise SystemExit(out.stdout[-3000:] + out.stderr)
    say(f"=== 1. lokid's .deb ({deb.name}) installed by apt in Debian 13: "
        f"{time.monotonic() - t0:.0f} s ===")
    for name in (P, "s"):
        ct.write_file(f"{MODEL_DIR}/{name}.gguf", (work / f"{name}.gguf").read_bytes())
    ct.write_file(PROBE, (ROOT / "scripts" / "replica_probes.py").read_bytes())
    return ct


def configure(ct: Container, gw: int, base: int) -> None:
    ct.write_file("/etc/loki/lokid.toml",
                  f'engine = "{ENGINE_DIR}/{os.path.basename(engine_binary())}"\n'
                  f'model_dirs = ["{MODEL_DIR}"]\n[gateway]\nlisten = ["127.0.0.1:{gw}"]\n')
    run(ct, "rm", "-f", "/etc/loki/presets/example.toml")
    ct.write_file(f"/etc/loki/presets/{P}.toml",
                  f'model = "{P}.gguf"\nctx = 4096\nport = {base}\n'
                  'extra_args = ["-np", "2", "-t", "1"]\n[serve]\non_demand = true\n'
                  f'idle_stop = {IDLE_STOP}\nmax_replicas = 3\n')
    ct.write_file("/etc/loki/presets/s.toml",
                  f'model = "s.gguf"\nctx = 2048\nport = {free_port()}\n'
                  'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service", timeout=120)
    time.sleep(2)
    ct.systemctl("start", "loki-gateway.socket", "sockets.target")
    ct.write_file("/root/conf.json", json.dumps({"port": gw, "preset": P, "second": "s"}))
    say(f"$ cat /etc/loki/presets/{P}.toml\n" + run(ct, "cat", f"/etc/loki/presets/{P}.toml"))
    say(f"$ lokictl replica list {P}\n" + run(ct, "lokictl", "replica", "list", P))


def rows(ct: Container) -> list[dict[str, Any]]:
    try:
        return list(json.loads(run(ct, "lokictl", "replica", "list", P, "--json")))
    except ValueError:
        return []


def live(rs: list[dict[str, Any]]) -> dict[int, str]:
    return {int(r["index"]): str(r["state"]) for r in rs if r.get("state") != "inactive"}


def now(ct: Container) -> float:
    return float(run(ct, "date", "+%s.%N"))


def probe_start(ct: Container, cmd: str, extra: dict[str, Any]) -> str:
    """The probe ``cmd`` as a transient unit; the file its result lands in."""
    conf = json.loads(ct.read_file("/root/conf.json"))
    conf.update(extra)
    ct.write_file(f"/root/{cmd}.json", json.dumps(conf))
    out = f"/root/{cmd}.out.{int(time.time())}"
    run(ct, "systemd-run", "--collect", f"--unit=walk-{cmd}-{int(time.time())}",
        "python3", PROBE, cmd, f"/root/{cmd}.json", out)
    return out


def probe_done(ct: Container, out: str) -> dict[str, Any] | None:
    if run(ct, "sh", "-c", f"test -f {out} && echo y") != "y":
        return None
    return dict(json.loads(ct.read_file(out)))


def probe_wait(ct: Container, out: str, limit: float) -> dict[str, Any]:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        res = probe_done(ct, out)
        if res is not None:
            return res
        time.sleep(2)
    raise SystemExit(f"the probe wrote no {out} in {limit:.0f} s")


def engine_requests(ct: Container, since: float, until: float) -> dict[int, int]:
    out = {}
    for k in (1, 2, 3):
        n = run(ct, "sh", "-c", f"journalctl -q -o cat -u {unit(k)} --since @{since:.0f} "
                f"--until @{until + 1:.0f} | grep -c 'stop processing' || true")
        out[k] = int(n or 0)
    return out


def plans(ct: Container) -> dict[int, str]:
    """Each engine's port and context from the last ``plan:`` line of its journal."""
    out = {}
    for k in (1, 2, 3):
        line = run(ct, "sh", "-c", f"journalctl -q -o cat -u {unit(k)} | grep '^plan:' | "
                   "tail -1").split()
        out[k] = " ".join(f"{a} {b}" for a, b in zip(line, line[1:], strict=False)
                          if a in ("--port", "-c", "-np"))
    return out


def failures(recs: list[dict[str, Any]]) -> tuple[dict[str, int], list[dict[str, Any]]]:
    codes: dict[str, int] = {}
    bad = []
    for r in recs:
        ok = r["code"] == 200 and r["whole"]
        label = str(r["code"]) + ("" if ok else f" {r['err'].split(':')[0][:60] or 'cut'}")
        codes[label] = codes.get(label, 0) + 1
        if not ok:
            bad.append(r)
    return codes, bad


def journal(ct: Container, since: float, pattern: str, *units: str) -> list[tuple[float, str]]:
    args = " ".join(f"-u {u}" for u in units)
    text = run(ct, "sh", "-c", f"journalctl -q -o short-unix --since @{since:.0f} {args} "
               f"| grep -E {pattern!r} || true")
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            out.append((float(stamp), rest))
        except ValueError:
            continue
    return out


def rise_and_fall(ct: Container, seconds: float) -> None:
    light = seconds
    say(f"\n=== 2. 1 -> N -> 1 under load: 8 threads for {seconds:.0f} s, then one thread "
        f"for {TAIL} s ===")
    say("warm (the on-demand start of r): " + run(
        ct, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "300",
        "-H", "Content-Type: application/json", "-d",
        json.dumps({"model": P, "max_tokens": 4, "messages": [{"role": "user",
                                                               "content": "hi"}]}),
        f"http://127.0.0.1:{json.loads(ct.read_file('/root/conf.json'))['port']}"
        "/v1/chat/completions"))
    t0 = now(ct)
    out = probe_start(ct, "load", {"seconds": seconds + TAIL, "light": light})
    timeline: list[tuple[float, dict[int, str]]] = []
    by_hand: list[str] = []
    seen = 1
    res = None
    while res is None:
        time.sleep(4)
        t = now(ct) - t0
        lv = live(rows(ct))
        seen = max(seen, len(lv))
        if not timeline or timeline[-1][1] != lv:
            timeline.append((t, lv))
        if t >= 0.4 * seconds and seen == 1 and not by_hand:
            for _ in range(2):
                by_hand.append(f"{t:.0f} s: $ lokictl replica start {P}: "
                               + run(ct, "lokictl", "replica", "start", P))
                time.sleep(3)
        res = probe_done(ct, out)
    t_end = now(ct) - t0
    # back to 1: the rule's idle stop (30 s idle), else by hand
    wait_until = time.monotonic() + IDLE_STOP / 4 + 45
    while time.monotonic() < wait_until and len(live(rows(ct))) > 1 and not by_hand:
        time.sleep(4)
        lv = live(rows(ct))
        if timeline[-1][1] != lv:
            timeline.append((now(ct) - t0, lv))
    for k in sorted(live(rows(ct)), reverse=True):
        if k > 1:
            by_hand.append(f"{now(ct) - t0:.0f} s: $ lokictl replica stop {P} {k}: "
                           + run(ct, "lokictl", "replica", "stop", P, str(k)))
    time.sleep(3)
    timeline.append((now(ct) - t0, live(rows(ct))))
    recs = res["records"]
    say("engines over time (s from the load's start: index state), changes only:")
    for t, lv in timeline:
        say(f"  {t:6.0f}  " + ", ".join(f"{k} {s}" for k, s in sorted(lv.items())))
    say(f"the load ended at {t_end:.0f} s")
    acts = journal(ct, t0, "starting replica|stopping replica|replica .*: (ready|inactive)"
                   "|preset r: ", "lokid.service", "loki-gateway.service")
    starts = [t - t0 for t, x in acts if "starting replica" in x]
    stops = [t - t0 for t, x in acts if "stopping replica" in x]
    say("lokid's and the gateway's lines about replicas:")
    for t, x in acts[:40]:
        say(f"  {t - t0:6.1f}  {x[x.find(': ') + 2:][:150] if ': ' in x else x[:150]}")
    minutes = int(max([t_end, *starts, *stops]) // 60) + 1
    per = [(sum(int(s // 60) == m for s in starts), sum(int(s // 60) == m for s in stops))
           for m in range(minutes)]
    say("starts/stops per minute: " + ", ".join(f"min {m}: {a}/{b}"
                                                 for m, (a, b) in enumerate(per)))
    say("by hand: " + ("; ".join(by_hand) if by_hand else "nothing (the rule did it)"))
    say("each engine's requests (its journal's 'stop processing' lines): "
        f"{engine_requests(ct, t0, t0 + t_end)}")
    codes, bad = failures(recs)
    to_s = sum(r["model"] == "s" for r in recs)
    say(f"requests: {len(recs)} ({sum(r['stream'] for r in recs)} streamed, {to_s} to s); "
        f"by status: {codes}")
    for r in bad[:8]:
        say(f"  failed: {r}")
    rule = "rule" if not any("start" in b for b in by_hand) else "by hand"
    SUMMARY.append(("2. 1->N->1 under load",
                    f"max {seen} engines ({rule}); starts {len(starts)}, stops {len(stops)}; "
                    f"{len(recs)} requests, {len(bad)} failed"))


def roll(ct: Container, seconds: float) -> None:
    say(f"\n=== 3. an edit rolling through three engines under 8 threads ({seconds:.0f} s) ===")
    if not live(rows(ct)).get(1) == "ready":   # step 2 left out: its engine not started
        say(f"$ lokictl start {P} --wait: " + run(ct, "lokictl", "start", P, "--wait",
                                                    timeout=300))
    for _ in range(6):
        if len(live(rows(ct))) >= 3:
            break
        say(f"$ lokictl replica start {P}: " + run(ct, "lokictl", "replica", "start", P))
        time.sleep(2)
    end = time.monotonic() + 180
    while time.monotonic() < end and sorted(live(rows(ct)).values()) != ["ready"] * 3:
        time.sleep(2)
    say(f"before: {live(rows(ct))}")
    t0 = now(ct)
    out = probe_start(ct, "load", {"seconds": seconds})
    time.sleep(min(10, seconds / 5))
    say(f"$ lokictl set {P} ctx=8192: " + run(ct, "lokictl", "set", P, "ctx=8192"))
    c0 = time.monotonic()
    say(f"$ lokictl restart {P}: " + run(ct, "lokictl", "restart", P)
        + f" ({time.monotonic() - c0:.1f} s)")
    res = probe_wait(ct, out, seconds + 600)
    t_end = now(ct) - t0
    lines = journal(ct, t0, "restarting replica|drain|Stopping|Started|not ready again",
                    "lokid.service", unit(1), unit(2), unit(3))
    say("the roll in the journal (s from the load's start):")
    for t, x in lines:
        say(f"  {t - t0:6.1f}  {x[:150]}")
    order = [x.split("loki-engine@")[1].split(".service")[0] for _, x in lines
             if "Started" in x and "loki-engine@" in x]
    codes, bad = failures(res["records"])
    say(f"restarted in order: {order}; load ended at {t_end:.0f} s")
    say(f"requests: {len(res['records'])}; by status: {codes}")
    for r in bad[:8]:
        say(f"  failed: {r}")
    say(f"each engine's context now (its last plan line): {plans(ct)}; after: "
        f"{live(rows(ct))}")
    SUMMARY.append(("3. edit rolling through", f"order {order}; {len(res['records'])} "
                    f"requests, {len(bad)} failed"))


def kill(ct: Container) -> None:
    say("\n=== 4. replica 2 SIGKILLed while a client streams from it ===")
    say(f"engines: {live(rows(ct))}")
    before = ct.show(unit(2), "NRestarts")["NRestarts"]
    t0 = now(ct)
    out = probe_start(ct, "kill", {"tokens": KILL_TOKENS})
    end, killed = time.monotonic() + 60, ""
    while time.monotonic() < end:
        r2 = [r for r in rows(ct) if r["index"] == 2]
        if r2 and r2[0].get("in_flight", 0) > 0:
            killed = f"replica 2 in flight {r2[0]['in_flight']}"
            break
        time.sleep(0.3)
    say(f"killing {unit(2)} ({killed or 'no request seen in flight on it in 60 s'}): "
        + run(ct, "systemctl", "kill", "-s", "KILL", unit(2)))
    tk = now(ct)
    res = probe_wait(ct, out, 600)
    cut = [s for s in res["streams"] if not s["whole"]]
    for s in res["streams"]:
        say(f"  stream {s['i']}: {s['code']} whole={s['whole']} chars={s['chars']} "
            f"{s['dur']} s; last event: {s['last'][:160]}"
            + (f"\n     next turn: {s['next']}" if "next" in s else ""))
    say(f"each engine's requests ended after the kill (journal's 'stop processing'): "
        f"{engine_requests(ct, tk, now(ct))} (before it, from the streams' start: "
        f"{engine_requests(ct, t0, tk)})")
    end = time.monotonic() + 120
    while time.monotonic() < end and ct.show(unit(2), "ActiveState")["ActiveState"] != "active":
        time.sleep(1)
    st = ct.show(unit(2), "ActiveState", "SubState", "NRestarts", "Result")
    time.sleep(5)
    say(f"{unit(2)} after: {st} (NRestarts before {before}); rows {live(rows(ct))}")
    nexts = [s["next"]["code"] for s in cut if "next" in s]
    SUMMARY.append(("4. replica killed mid-stream",
                    f"{len(cut)} streams cut, error event in "
                    f"{sum('error' in s['last'] for s in cut)}; next turns {nexts}; unit "
                    f"{st['ActiveState']}, NRestarts {before}->{st['NRestarts']}"))


def units(ct: Container, base: int) -> None:
    say(f"\n=== 5. the unit {unit(2)} ===")
    if 2 not in live(rows(ct)):   # the steps before it left out
        say(f"$ lokictl start {P}: " + run(ct, "lokictl", "start", P, timeout=300))
        for _ in range(2):
            say(f"$ lokictl replica start {P}: " + run(ct, "lokictl", "replica", "start", P))
        time.sleep(10)
    props = ("StartLimitBurst", "StartLimitIntervalUSec", "Restart", "RestartUSec",
             "KillSignal", "KillMode", "TimeoutStopUSec", "FinalKillSignal", "MemoryMax",
             "MemoryHigh", "MemorySwapMax", "DevicePolicy", "DeviceAllow", "User",
             "NoNewPrivileges", "ProtectSystem", "OOMPolicy")
    two, one = ct.show(unit(2), *props), ct.show(unit(1), *props)
    for p in props:
        say(f"  {p}={two.get(p)}" + ("" if two.get(p) == one.get(p)
                                      else f"   (replica 1: {one.get(p)})"))
    ports = run(ct, "ss", "-ltnpH")
    mine = [x for x in ports.splitlines()
            if any(f":{base + d} " in x for d in range(-1, 4))]
    say(f"listening on ports {base - 1}..{base + 3} (the preset's {base}, replicas "
        f"{base + 1}, {base + 2}):")
    for x in mine:
        say(f"  {' '.join(x.split())[:160]}")
    for k, plan in plans(ct).items():
        say(f"  {unit(k)}: {plan} (expected --port {base + k - 1}"
            + (": replica 1's port is systemd's socket, passed to it)" if k == 1 else ")"))
    t = time.monotonic()
    run(ct, "systemctl", "stop", unit(2), timeout=200)
    took = time.monotonic() - t
    st = ct.show(unit(2), "Result", "ExecMainCode", "ExecMainStatus", "ActiveState")
    tail = run(ct, "journalctl", "-q", "-o", "cat", "-n", "4", "-u", unit(2))
    say(f"systemctl stop {unit(2)} (SIGTERM): {took:.2f} s; {st}\n  its last lines: "
        + " | ".join(tail.splitlines())[:400])
    say(f"rows after: {live(rows(ct))}; $ lokictl replica start {P}: "
        + run(ct, "lokictl", "replica", "start", P))
    loop = "; ".join(crash_loop(ct, k) for k in CRASH)
    SUMMARY.append(("5. unit r:2", f"StartLimit {two.get('StartLimitBurst')}/"
                    f"{two.get('StartLimitIntervalUSec')}, {two.get('KillSignal')} "
                    f"stop {took:.1f} s ({st.get('Result')}), MemoryMax "
                    f"{two.get('MemoryMax')}, DevicePolicy {two.get('DevicePolicy')}; "
                    f"killed 6 times: {loop}"))


def crash_loop(ct: Container, k: int) -> str:
    """The unit has no systemd start limit (StartLimitIntervalSec=0, by design): lokid's
    crash-loop rule (lokid.core.launch.crashloop, 5 failures in 10 min) is what stops a
    replica that keeps dying. Killed 6 times as soon as it is up: its state each time."""
    states = []
    for _ in range(6):
        end = time.monotonic() + 90
        while time.monotonic() < end and ct.show(unit(k), "ActiveState")["ActiveState"] \
                not in ("active", "failed"):
            time.sleep(0.5)
        st = ct.show(unit(k), "ActiveState", "NRestarts")
        states.append(f"{st['ActiveState']}/{st['NRestarts']}")
        if st["ActiveState"] == "failed":
            break
        run(ct, "systemctl", "kill", "-s", "KILL", unit(k))
        time.sleep(1)
    time.sleep(8)
    st = ct.show(unit(k), "ActiveState", "Result", "ExecMainStatus", "StatusText",
                 "NRestarts")
    say(f"{unit(k)} SIGKILLed as soon as up, 6 times (state/NRestarts each time): "
        f"{states}; then {st}; preset r's own engine {ct.show(unit(1), 'ActiveState')}")
    said = run(ct, "sh", "-c", f"journalctl -q -o cat -u {unit(k)} | grep -iE "
               "'failure|crash|forg|automatic|refus|exits? ' | tail -14")
    say("  lokid's lines in its journal about it:\n    " + "\n    ".join(said.splitlines()))
    say(f"  /run/loki/{P}:{k}.failures: "
        + run(ct, "cat", f"/run/loki/{P}.failures" if k == 1 else f"/run/loki/{P}:{k}.failures")
        + "\n  the unit's own lines (not the engine's): " + " | ".join(run(
            ct, "sh", "-c", f"journalctl -q -o cat -u {unit(k)} | grep -v '^[0-9]' | "
            "tail -12").splitlines())[:1500])
    say(f"$ systemctl start {unit(k)} (a start by hand forgets the failures): "
        + run(ct, "systemctl", "start", unit(k), timeout=200))
    end = time.monotonic() + 60
    while time.monotonic() < end and ct.show(unit(k), "ActiveState")["ActiveState"] \
            != "active":
        time.sleep(1)
    say(f"  then {unit(k)}: {ct.show(unit(k), 'ActiveState')}; rows {live(rows(ct))}")
    return f"{states[-1]}, {st.get('StatusText', '')[:60]}"


def attacker(ct: Container) -> None:
    say("\n=== 6. the attacker ===")
    res = probe_wait(ct, probe_start(ct, "names", {}), 300)
    say("-- model names at the gateway (no key: a keyless gateway on loopback) --")
    for k, v in res.items():
        say(f"   {k}: {v}")
    say("-- user nobody --")
    before = live(rows(ct))
    got = []
    for argv in (["lokictl", "replica", "list", P], ["lokictl", "replica", "start", P],
                 ["lokictl", "replica", "stop", P, "2"]):
        o = run(ct, *NOBODY, *argv)
        got.append(o.splitlines()[-1][:120] if o else "")
        say(f"   $ {' '.join(argv)}: {o[-220:]}")
    for sig, args in (("s", [P]), ("su", [P, "2"])):
        method = "StartReplica" if sig == "s" else "StopReplica"
        o = run(ct, *NOBODY, "busctl", "call", *BUS, method, sig, *args)
        got.append(o[:120])
        say(f"   busctl call {method} {' '.join(args)} as nobody: {o[-220:]}")
    time.sleep(2)
    after = live(rows(ct))
    say(f"   engines before {before}, after {after}")
    say("-- hostile arguments as root (the bus's checks) --")
    for method, sig, args in (("StartReplica", "s", [f"{P}:2"]),
                              ("StartReplica", "s", [f"../{P}"]),
                              ("StartReplica", "s", ["nope"]),
                              ("StopReplica", "su", [P, "1"]),
                              ("StopReplica", "su", [P, "0"]),
                              ("StopReplica", "su", [P, "4294967295"]),
                              ("StopReplica", "su", [f"{P}:2", "2"]),
                              ("StartPreset", "s", [f"{P}:2"])):
        o = run(ct, "busctl", "call", *BUS, method, sig, *args)
        say(f"   {method} {' '.join(args)}: {o[-200:]}")
    say(f"   engines now: {live(rows(ct))}")
    SUMMARY.append(("6. attacker", f"names: {sorted(set(v[:3] for v in res.values()))}; "
                    f"nobody: engines unchanged {before == after}"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--roll", type=float, default=60)
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated: 2-6")
    ap.add_argument("--deb", type=Path, help="a lokid .deb already built")
    ap.add_argument("--crash-loop", default="2", help="engines step 5 SIGKILLs 6 times "
                    "(1: the preset's own), comma-separated")
    ap.add_argument("--head", action="store_true", help="build from the last commit")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    CRASH[:] = [int(k) for k in args.crash_loop.split(",") if k]
    with tempfile.TemporaryDirectory() as tmp:
        deb = args.deb or build(Path(tmp), args.head)
        ct = boot(Path(tmp), deb)
        try:
            base = free_ports(3)
            configure(ct, free_port(), base)
            steps: dict[str, Callable[[], None]] = {"2": lambda: rise_and_fall(ct, args.seconds),
                     "3": lambda: roll(ct, args.roll), "4": lambda: kill(ct),
                     "5": lambda: units(ct, base), "6": lambda: attacker(ct)}
            for key, step in steps.items():
                if key not in skip:
                    try:
                        step()
                    except Exception as e:   # the next step still runs; said here
                        say(f"step {key} failed: {type(e).__name__}: {e}")
                        SUMMARY.append((f"{key}. (failed)", f"{type(e).__name__}: {e}"[:160]))
            say("\n=== summary ===")
            for k, v in SUMMARY:
                say(f"  {k:<30} {v}")
            tb = run(ct, "sh", "-c", "journalctl -q -u loki-gateway -u lokid | grep -c "
                     "Traceback || true")
            say(f"tracebacks in the gateway's and lokid's journal: {tb}")
        finally:
            ct.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
