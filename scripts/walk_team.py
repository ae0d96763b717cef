#!/usr/bin/env python3
"""The walk of issue 46, from the Debian package under real systemd, printed: a team at
one keyed gateway, then an attacker at it.

Not a test (each rule has its own under tests/): what a team gets and what an attacker
gets, on a Debian 13 container booted with real systemd and journald at its default
limits, lokid's .deb installed by apt, the real CPU engine, tiny generated models.
Presets: ``a`` (-np 4, on demand: the one the batch key floods), ``b`` (-np 2, on
demand, alias ``gpt-4o-mini``), ``x`` (external: a capture API on loopback that writes
down every header it receives). Five keys made with ``lokictl keys add``:

- ``batch`` (class batch): after the quiet phase, 4 threads of long streams to ``a``;
- ``capped`` (tokens_per_day small): asks ``b`` until 429 insufficient_quota, and on;
- ``leaver``: revoked with ``lokictl keys revoke`` in the middle of a stream;
- ``scoped`` (models = a): interactive chats to ``a``;
- ``claude``: /v1/messages to ``a`` with ``x-api-key`` and ``anthropic-version`` (raw
  httpx: the container has no PyPI, so no ``anthropic`` package).

1. the team, 8 threads (scripts/team_probes.py load): per key requests and codes,
   interactive time to first token without the flood and under it, the tokens the
   clients read in the answers' own timings/usage against ``lokictl usage --json``,
   failures, lokid's count (``lokictl stats``), the gateway's memory, the journal's
   size, audit records per key (``journalctl LOKID_KEY=``);
2. the attacker: guessing keys and their timing, the scoped key at ``b`` by every route,
   a revoked and an expired key, ``?api_key=``, what reaches the external API, the
   journal searched for every key, keys.toml damaged by root, nobody at the Keys and
   Usage interfaces and forging GatewayUsage.

    .venv/bin/python scripts/walk_team.py [--seconds 300] [--quiet 90] [--skip attacker]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
PROBE = "/root/team_probes.py"
CONF = "/root/walk.json"          # the keys: root-only, never in argv
CAPTURED = "/root/captured.jsonl"
KEYS_FILE = "/etc/loki/clients/keys.toml"
NAMES = ("batch", "capped", "leaver", "scoped", "claude")
BUDGET = 600                      # the capped key's tokens a day


def say(text: str) -> None:
    print(text, flush=True)


def run(ct: Container, *argv: str, timeout: float = 600) -> str:
    r = ct.run(list(argv), check=False, timeout=timeout)
    return str(r.stdout + r.stderr).rstrip()


def probe(ct: Container, *args: str, timeout: float = 900) -> dict[str, Any]:
    out = run(ct, "python3", PROBE, *args, CONF, timeout=timeout)
    try:
        return dict(json.loads(out.splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": out[-1500:]}


def gateway_memory(ct: Container) -> str:
    pid = run(ct, "systemctl", "show", "-P", "MainPID", "loki-gateway.service")
    status = run(ct, "cat", f"/proc/{pid}/status")
    keep = dict(x.split(":", 1) for x in status.splitlines()
                if x.startswith(("VmRSS:", "VmHWM:")))
    return f"RSS {keep.get('VmRSS', '?').strip()}, peak {keep.get('VmHWM', '?').strip()}"


def boot(work: Path) -> Container:
    b = cached_build(SUITE, work / "deb")
    if b.rc != 0:
        raise SystemExit(b.log[-4000:])
    for name in ("a", "b"):
        write_llama(work / f"{name}.gguf", n_layers=4, n_embd=256, n_head=4, n_head_kv=4,
                    n_ff=512, seed=ord(name))
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary())}
    ct = Container(suite=SUITE, packages=runtime_packages(SUITE), binds=binds)
    ct.start()
    t0 = time.monotonic()
    run(ct, "apt-get", "-q", "-y", "update")
    out = ct.run(["apt-get", "-q", "-y", "install", f"/debs/{b.deb.name}"], check=False,
                 timeout=900, env={"DEBIAN_FRONTEND": "noninteractive"})
    if out.returncode != 0:
        ct.stop()
        raise SystemExit(out.stdout[-3000:] + out.stderr)
    say(f"=== 0. lokid's .deb installed by apt in Debian 13: {time.monotonic() - t0:.0f} s ===")
    for name in ("a", "b"):
        ct.write_file(f"{MODEL_DIR}/{name}.gguf", (work / f"{name}.gguf").read_bytes())
    ct.write_file(PROBE, (ROOT / "scripts" / "team_probes.py").read_bytes())
    return ct


def configure(ct: Container, port: int) -> dict[str, Any]:
    """lokid.toml, the presets, journald at its defaults, the capture API, the keys."""
    run(ct, "rm", "-f", "/etc/systemd/journald.conf.d/lokid-harness.conf")
    run(ct, "systemctl", "restart", "systemd-journald.service")
    cap_port = free_port()
    run(ct, "systemd-run", "--unit=capture-api", "python3", PROBE, "capture", str(cap_port),
        CAPTURED)
    ct.write_file("/etc/loki/lokid.toml",
                  f'engine = "{ENGINE_DIR}/{os.path.basename(engine_binary())}"\n'
                  f'model_dirs = ["{MODEL_DIR}"]\n'
                  f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
    run(ct, "rm", "-f", "/etc/loki/presets/example.toml")
    ct.write_file("/etc/loki/presets/a.toml",
                  f'model = "a.gguf"\nctx = 4096\nport = {free_port()}\n'
                  'extra_args = ["-np", "4"]\n[serve]\non_demand = true\n')
    ct.write_file("/etc/loki/presets/b.toml",
                  f'model = "b.gguf"\nctx = 2048\nport = {free_port()}\n'
                  'aliases = ["gpt-4o-mini"]\nextra_args = ["-np", "2"]\n'
                  '[serve]\non_demand = true\n')
    ct.write_file("/etc/loki/presets/x.toml",
                  f'kind = "external"\nurl = "http://127.0.0.1:{cap_port}/v1"\n')
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service", timeout=120)
    time.sleep(2)
    keys: dict[str, str] = {}
    flags = {"batch": ["--class", "batch"], "capped": ["--tokens-per-day", str(BUDGET)],
             "leaver": [], "scoped": ["--models", "a"], "claude": []}
    for name in NAMES:
        keys[name] = run(ct, "lokictl", "keys", "add", name, *flags[name]).splitlines()[0]
    keys["expired"] = run(ct, "lokictl", "keys", "add", "expired", "--expires",
                          "5s").splitlines()[0]
    say("$ lokictl keys list\n" + run(ct, "lokictl", "keys", "list"))
    ct.systemctl("start", "loki-gateway.socket", "sockets.target")
    ct.write_file(CONF, json.dumps({"port": port, "keys": keys, "external": cap_port}))
    run(ct, "chmod", "600", CONF)
    return keys


def pct(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    return f"{sorted(xs)[int(q * (len(xs) - 1))] * 1000:.0f}"


def usage_rows(ct: Container) -> list[dict[str, Any]]:
    try:
        return list(json.loads(run(ct, "lokictl", "usage", "--by", "key", "--json")))
    except ValueError:
        return []


def gateway_answers(ct: Container) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in ("a", "b", "x"):
        try:
            stats = json.loads(run(ct, "lokictl", "stats", name, "--json"))
        except ValueError:
            continue
        for code, n in (stats.get("gateway_requests") or {}).items():
            out[code] = out.get(code, 0) + int(n)
    return out


def team(ct: Container, keys: dict[str, str], port: int, seconds: float, quiet: float
         ) -> None:
    say(f"\n=== 1. the team: 8 threads for {seconds:.0f} s, the batch key's flood from "
        f"{quiet:.0f} s, leaver revoked at {quiet + (seconds - quiet) / 2:.0f} s ===")
    conf = json.loads(ct.read_file(CONF))
    conf.update(seconds=seconds, quiet=quiet, revoke_at=quiet + (seconds - quiet) / 2)
    ct.write_file(CONF, json.dumps(conf))
    # warm: each engine started once, its counts then taken as the walk's start
    probe(ct, "serve")
    time.sleep(4)   # its counts reported (once a second) before the walk's start is read
    base_usage = {r.get("key"): r for r in usage_rows(ct)}
    base_answers = gateway_answers(ct)
    since = run(ct, "date", "+%Y-%m-%d %H:%M:%S")
    time.sleep(1.5)
    res = probe(ct, "load", timeout=seconds + 900)
    if "records" not in res:
        say(f"the load failed: {res}")
        return
    recs: list[dict[str, Any]] = res["records"]
    time.sleep(4)   # the gateway reports its counts once a second
    say("per key: requests, codes (the error's type/code), tokens the answers gave")
    fails = 0
    for name in NAMES:
        mine = [r for r in recs if r["key"] == name]
        codes: dict[str, int] = {}
        for r in mine:
            label = str(r["code"]) + (f" {r['err']}" if r["err"] else "")
            codes[label] = codes.get(label, 0) + 1
        cut = [r for r in mine if r["code"] == 200 and not r["whole"]]
        bad = [r for r in mine if r["code"] >= 500 or r["code"] == 0]
        fails += len(cut) + len(bad)
        nostart = sum(r["stream"] and r["code"] == 200 and not r.get("start")
                      for r in mine) if name == "claude" else 0
        say(f"  {name}: {len(mine)} requests, {codes}; 5xx/no answer {len(bad)}, "
            f"cut streams {len(cut)}"
            + (f"; streams without message_start: {nostart}" if nostart else ""))
    capped = sorted((r for r in recs if r["key"] == "capped"), key=lambda r: r["m0"])
    first = next((i for i, r in enumerate(capped) if r["code"] == 429), None)
    if first is not None:
        after = [r["code"] for r in capped[first:]]
        served = sum(r.get("gen") or 0 for r in capped[:first] if r["code"] == 200)
        prompt = sum(r.get("prompt") or 0 for r in capped[:first] if r["code"] == 200)
        say(f"  capped: first 429 at request {first + 1} ({capped[first]['err']}) after "
            f"{prompt}+{served} tokens (budget {BUDGET}); after it: "
            f"{sum(c == 200 for c in after)} served, {sum(c == 429 for c in after)} 429")
    else:
        say("  capped: never refused during the walk")
    say(f"  leaver: {res.get('leaver')}")
    say(f"failures (5xx, no answer or a cut stream the walk did not cause): {fails}")

    say("\ninteractive time to first token, streamed 200s of scoped, claude, leaver, "
        "capped (ms):")
    for label, flood in (("without the flood", False), ("under the flood", True)):
        ttft = [r["ttft"] for r in recs if r["key"] != "batch" and r["flood"] == flood
                and r["code"] == 200 and r["ttft"] is not None]
        say(f"  {label}: n={len(ttft)} p50 {pct(ttft, 0.5)} p95 {pct(ttft, 0.95)}")
    a_only = {f: [r["ttft"] for r in recs if r["key"] in ("scoped", "claude")
                  and r["flood"] == f and r["code"] == 200 and r["ttft"] is not None]
              for f in (False, True)}
    if a_only[False] and a_only[True]:
        say(f"  scoped+claude on a: p50 ratio {statistics.median(a_only[True]) / statistics.median(a_only[False]):.2f}, "  # noqa: E501
            f"p95 {pct(a_only[True], 0.95)}/{pct(a_only[False], 0.95)} ms")
    batch = [r for r in recs if r["key"] == "batch" and r["code"] == 200]
    say(f"  batch streams served: {len(batch)}, generated {sum(r.get('gen') or 0 for r in batch)}"
        " tokens")

    say("\nexactness: the answers' own figures (clients) vs lokictl usage --by key --json "
        "(the walk's part)")
    rows = {r.get("key"): r for r in usage_rows(ct)}
    for name in NAMES:
        mine = [r for r in recs if r["key"] == name and r["code"] == 200]
        cp = sum(r.get("prompt") or 0 for r in mine)
        cg = sum(r.get("gen") or 0 for r in mine)
        none = sum(r.get("gen") is None for r in mine)
        now, was = rows.get(name, {}), base_usage.get(name, {})
        up = int(now.get("prompt_tokens", 0)) - int(was.get("prompt_tokens", 0))
        ug = int(now.get("generated_tokens", 0)) - int(was.get("generated_tokens", 0))
        ur = int(now.get("requests", 0)) - int(was.get("requests", 0))
        refused = {k: int(v) - int(was.get(k, 0)) for k, v in now.items()
                   if str(k).startswith("refused_")}
        say(f"  {name}: clients {len(mine)} 200s, prompt {cp}, generated {cg}"
            f"{f' ({none} answers without figures)' if none else ''}; usage requests {ur}, "
            f"prompt {up}, generated {ug}, {refused}; difference prompt {up - cp}, "
            f"generated {ug - cg}")
    say(f"  usage rows now: {json.dumps(list(rows.values()))[:600]}")

    answers = gateway_answers(ct)
    counted = {k: v - base_answers.get(k, 0) for k, v in answers.items()
               if v - base_answers.get(k, 0)}
    clients: dict[str, int] = {}
    for r in recs:
        clients[str(r["code"])] = clients.get(str(r["code"]), 0) + 1
    say(f"\nlokid's count (lokictl stats a/b/x gateway_requests, the walk's part): {counted}"
        f"\nthe clients': {clients} ({len(recs)} requests)")
    say("audit records (journalctl LOKID_KEY=NAME --since the walk) vs the clients':")
    for name in NAMES:
        n = run(ct, "sh", "-c", f"journalctl -q --since '{since}' LOKID_KEY={name} "
                "-o cat | wc -l")
        say(f"  {name}: {n} records, {sum(r['key'] == name for r in recs)} requests")
    say(f"  key '-' (a refused 401 has none, by design): {run(ct, 'sh', '-c', f'journalctl -q --since {since!r} LOKID_KEY=- -o cat | wc -l')}")  # noqa: E501
    say(f"gateway: {gateway_memory(ct)}; {run(ct, 'journalctl', '--disk-usage')}")
    supp = run(ct, "journalctl", "--no-pager", "-q", "-o", "cat", "--since", since,
               "MESSAGE_ID=a596d6fe7bfa4994828e72309e95d61e")
    say(f"journald suppressed: {supp[-300:] or 'nothing'}")
    tb = run(ct, "sh", "-c", f"journalctl -q --since '{since}' -u loki-gateway -u lokid "
             "| grep -c Traceback")
    say(f"tracebacks in the gateway's and lokid's journal: {tb}")


def attacker(ct: Container, keys: dict[str, str], port: int) -> None:
    say("\n=== 2. the attacker ===")
    g = probe(ct, "guess")
    say(f"-- 2a. 1,000 wrong keys at GET /v1/models: {g.get('wrong_codes')}\n"
        f"   {g.get('pairs')} interleaved pairs: a wrong key with a real key's first 40 "
        f"characters p50 {g.get('near_p50_ms')} ms p95 {g.get('near_p95_ms')}; a random "
        f"wrong key p50 {g.get('far_p50_ms')} p95 {g.get('far_p95_ms')}; the right key "
        f"(200) p50 {g.get('right_p50_ms')} p95 {g.get('right_p95_ms')}\n"
        f"   near - far p50: {g.get('near_minus_far_p50_us')} us; the same kind's two halves "
        f"differ by {g.get('noise_same_kind_halves_us')} us (the noise)")
    if "error" in g:
        say(f"   {g['error']}")
    run(ct, "systemctl", "stop", "loki-engine@b.service")
    r = probe(ct, "routes")
    say("-- 2b. the scoped key (models = a) at b, and other keys --")
    for k, v in r.items():
        say(f"   {k}: {v}")
    say(f"   engine b after the scoped key's tries: {run(ct, 'systemctl', 'is-active', 'loki-engine@b')}")  # noqa: E501
    say("   a peer: not started here; tests/gateway/test_keys_scopes.py covers a scoped key "
        "and a peer's models")
    heads = [json.loads(x) for x in run(ct, "cat", CAPTURED).splitlines() if x.startswith("{")]
    names = sorted({h.lower() for x in heads for h in x})
    leaked = sum(any(v in json.dumps(x) for v in keys.values()) for x in heads)
    say(f"-- 2c. what the external API x received: {len(heads)} requests, headers {names}; "
        f"requests carrying any client key: {leaked}")
    hits = {name: run(ct, "sh", "-c", f"journalctl -q -o verbose | grep -c -F -- "
                      f"{key[-20:]!r} || true") for name, key in keys.items()}
    say(f"-- 2d. the whole journal (-o verbose, every unit, the engines' included) searched "
        f"for each key's last 20 characters: {hits}")

    say("-- 2e. keys.toml damaged by root --")
    run(ct, "cp", "-a", KEYS_FILE, "/root/keys.good")
    at = ct.cursor()
    ct.write_file(KEYS_FILE, "[[key]\nname = \"half\n" + "\x00\xff" * 10)
    time.sleep(2.5)
    say(f"   malformed: {probe(ct, 'serve')}; {gateway_memory(ct)}")
    run(ct, "sh", "-c", f"head -c 64M /dev/urandom | base64 -w 100 > {KEYS_FILE}")
    time.sleep(4)
    say(f"   64 MiB of base64 lines: {probe(ct, 'serve')}; {gateway_memory(ct)}")
    big = "".join(f'[keys.k{i}]\nhash = "sha256:{i:064x}"\nprefix = "sk-loki-{i}"\n'
                  for i in range(9000))
    ct.write_file(KEYS_FILE, ct.read_file("/root/keys.good") + big)
    time.sleep(6)
    say(f"   9,000 more entries ({len(big) >> 20} MiB): {probe(ct, 'serve')}; "
        f"{gateway_memory(ct)}")
    run(ct, "cp", "-a", "/root/keys.good", KEYS_FILE)
    time.sleep(3)
    say(f"   restored: {probe(ct, 'serve')}; {gateway_memory(ct)}")
    logged = [x for x in ct.journal("loki-gateway.service", since_cursor=at).splitlines()
              if "key" in x.lower()]
    say(f"   the gateway's log: {len(logged)} lines naming keys; " + " | ".join(
        x[-200:] for x in logged[:4]))

    say("-- 2f. user nobody at the Keys and Usage interfaces --")
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    for argv in (["lokictl", "keys", "list"], ["lokictl", "keys", "add", "mallory"],
                 ["lokictl", "keys", "revoke", "scoped"], ["lokictl", "usage", "--by", "key"]):
        out = run(ct, *nobody, *argv)
        say(f"   $ {' '.join(argv)}: {out[-220:]}")
    before = usage_rows(ct)
    out = run(ct, *nobody, "busctl", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
              "org.lokid.Lokid1.Usage", "GatewayUsage", "a(sssa{st})", "1",
              time.strftime("%Y-%m-%d", time.gmtime()), "scoped", "a", "1", "requests",
              "1000")
    time.sleep(1)
    same = before == usage_rows(ct)
    say(f"   GatewayUsage forged by nobody: {out[-220:]}; usage unchanged: {same}")
    out = run(ct, *nobody, "busctl", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
              "org.lokid.Lokid1.Usage", "KeyTotals")
    say(f"   KeyTotals by nobody: {out[-220:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--quiet", type=float, default=90,
                    help="seconds of the walk before the batch key floods")
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated: "
                    "team, attacker")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        ct = boot(Path(tmp))
        try:
            port = free_port()
            keys = configure(ct, port)
            if "team" not in skip:
                team(ct, keys, port, args.seconds, args.quiet)
            if "attacker" not in skip:
                attacker(ct, keys, port)
        finally:
            ct.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
