#!/usr/bin/env python3
"""A team's load on the one endpoint under a real systemd, and an operator's walk (issue 28).

In a booted Debian container: lokid installed as the tests install it (Debian 12,
the tree bound in), or with ``--deb`` built as a Debian package on Debian 13 and
installed there with apt, as an operator does. Four presets of the tiny llama behind
the socket-activated gateway: ``alpha`` and ``beta`` on demand in one GPU group
(one runs at a time: each turn is a swap), ``hot`` on demand alone, and ``remote``,
an external API (a second real llama-server on loopback that wants a key, given as
the preset's 0600 api_key_file).

The load (benchmarks/team_client.py, run inside the container): ``--threads`` (8)
clients for ``--seconds`` (180), each request for a preset picked at random
(alpha 3 : beta 3 : hot 1 : remote 1), a stream one time in two. Midway
(``--restart-at``, 0 for none), one long stream to ``hot`` starts and
``systemctl restart loki-gateway.service`` meets it, with the clients still at work.
Measured: requests answered and failed (by status and words), streams cut, requests
sent again after the server closed an idle keep-alive connection (retried, as HTTP
clients do), request times per preset (median, 99th percentile, longest), swaps (the
gateway's "swapping" lines), what the restart took and what the long stream got, the
gateway's memory (systemd's MemoryCurrent, sampled each second), and from the
journal of the whole boot: start-limit-hit, failed units, tracebacks, "Stats are
blind" lines. Exits 1 when a request failed, a stream was cut or a unit failed.

Then, by hand as an attacker would (``--probes``): the external key's path escape,
the slots, another site's page, a gzip bomb, deep JSON, a broken preset's words, a
body that never ends. With ``--deb``, last: ``apt remove`` and ``apt purge`` while the
clients are at work; after each, no process of lokid's users is left, and after
purge nothing of /var/lib/loki (the slots) either.

    .venv/bin/python benchmarks/gateway_team_systemd.py [--seconds 180] [--deb] [--probes]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support import REPO  # noqa: E402
from support import models as gen  # noqa: E402
from support.enginekit import engine_binary, free_port  # noqa: E402
from support.lokid_install import serve_gateway  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

ENGINE_DIR = "/opt/engine"
TOOLS = "/opt/bench"
GATEWAY = "loki-gateway.service"
UPSTREAM = "team-upstream.service"
SECRET = "sk-team-upstream-5c1e"
KEY_FILE = "/etc/loki/keys/remote.key"
LONG = 3800   # the stream a gateway restart meets: hot's context is the model's 4,096
GROUP = '[serve]\non_demand = true\ngroup = "gpu0"\n'

# A body that never ends: its head, then one byte every 5 s, until the gateway answers
# or closes (what it answered, after how long).
TRICKLE = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
          b"application/json\r\nContent-Length: 100000\r\n\r\n")
t = time.monotonic()
s.settimeout(5)
try:
    while True:
        s.sendall(b" ")
        try:
            d = s.recv(200)
        except socket.timeout:
            continue
        print(f"{time.monotonic() - t:.0f} s:", d.split(b"\r\n")[0].decode() or "closed")
        break
except OSError as e:
    print(f"{time.monotonic() - t:.0f} s: closed ({e})")
"""


class Walk:
    """The system under test: the container, where lokid's files are, and the figures."""

    def __init__(self, ct: Container, deb: bool, model_dir: str) -> None:
        self.ct = ct
        self.deb = deb
        self.model_dir = model_dir
        self.engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
        self.port = free_port()
        self.failed = False

    def say(self, text: str) -> None:
        print(text, flush=True)

    def lokictl(self, *args: str) -> str:
        argv = ["lokictl", *args] if self.deb else \
            ["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", *args]
        r = self.ct.run(argv, check=False, timeout=120)
        return r.stdout + r.stderr

    def gateway_kib(self, field: str) -> int:
        """VmRSS or VmHWM (its peak) of the gateway's process, KiB; 0 when none runs."""
        pid = self.ct.show(GATEWAY, "MainPID").get("MainPID", "0")
        r = self.ct.run(["grep", f"^{field}:", f"/proc/{pid}/status"], check=False)
        return int(r.stdout.split()[1]) if pid != "0" and r.returncode == 0 else 0

    def curl(self, *args: str, timeout: float = 60) -> tuple[int, str, str]:
        """Status, body and head of one curl from inside the container."""
        r = self.ct.run(["curl", "-sS", "-D", "/tmp/head", "-o", "/tmp/body", "-w",
                         "%{http_code}", "--max-time", str(timeout), *args],
                        check=False, timeout=timeout + 30)
        body = self.ct.run(["cat", "/tmp/body"], check=False).stdout
        head = self.ct.run(["cat", "/tmp/head"], check=False).stdout
        code = int(r.stdout) if r.stdout.strip().isdigit() else 0
        return code, body, head

    # set-up ----------------------------------------------------------------------------

    def configure(self) -> None:
        ct = self.ct
        up = free_port()
        ct.run(["mkdir", "-p", "/etc/loki/keys", "/etc/loki/presets"])
        ct.write_file(KEY_FILE, SECRET + "\n", mode=0o600)
        ct.run(["systemd-run", f"--unit={UPSTREAM}", "--property=DynamicUser=yes",
                self.engine, "-m", f"{self.model_dir}/llama.gguf", "--host", "127.0.0.1",
                "--port", str(up), "-c", "2048", "--api-key", SECRET])
        presets = {
            "alpha": f'model = "llama.gguf"\nctx = 2048\n{GROUP}',
            "beta": f'model = "llama.gguf"\nctx = 2048\n{GROUP}',
            "hot": 'model = "llama.gguf"\nctx = 4096\n[serve]\non_demand = true\n',
            "remote": f'kind = "external"\nurl = "http://127.0.0.1:{up}/v1"\n'
                      f'upstream_model = "tiny"\napi_key_file = "{KEY_FILE}"\n',
            # broken on purpose: the probes ask what a client is told of it
            "lost": 'model = "missing.gguf"\n[serve]\non_demand = true\n',
        }
        for name, body in presets.items():
            port = "" if "external" in body else f"port = {free_port()}\n"
            ct.write_file(f"/etc/loki/presets/{name}.toml", port + body)
        serve_gateway(ct, self.engine, self.model_dir, self.port)
        deadline = time.monotonic() + 120
        while self.curl(f"http://127.0.0.1:{up}/health")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the external API never answered:\n" +
                                   ct.journal(UPSTREAM)[-2000:])
            time.sleep(0.5)
        self.say(f"presets: {self.lokictl('presets')}")

    # the load --------------------------------------------------------------------------

    def load(self, seconds: float, threads: int, restart_at: float) -> dict[str, Any]:
        ct = self.ct
        cursor = ct.cursor()
        ct.run(["rm", "-f", "/tmp/long-started", "/tmp/team.json"])
        argv = ["python3", f"{TOOLS}/team_client.py", "--port", str(self.port),
                "--seconds", str(seconds), "--threads", str(threads), "--out",
                "/tmp/team.json"]
        if restart_at:
            argv += ["--long", f"hot:{LONG}@{restart_at}"]
        memory: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                rss = self.gateway_kib("VmRSS")
                if rss:
                    memory.append(rss)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.monotonic()
        client = ct.popen(argv)
        restart: dict[str, Any] = {}
        if restart_at:
            while ct.run(["test", "-e", "/tmp/long-started"], check=False).returncode:
                if time.monotonic() - t0 > seconds:
                    break
                time.sleep(0.2)
            else:
                r0 = time.monotonic()
                ct.systemctl("restart", GATEWAY, timeout=150)
                restart["took"] = time.monotonic() - r0
                restart["at"] = r0 - t0
        client.proc.wait(timeout=seconds + 900)
        done.set()
        sampler.join()
        out = client.stop()
        text = ct.run(["cat", "/tmp/team.json"], check=False).stdout
        if not text:
            raise RuntimeError(f"the load client wrote nothing:\n{out[-3000:]}")
        result: dict[str, Any] = json.loads(text)
        result.update(restart=restart, memory=memory, cursor=cursor, client_out=out)
        return result

    def report_load(self, result: dict[str, Any]) -> None:
        records: list[dict[str, Any]] = result["records"]
        failed = [r for r in records if r["status"] != 200 or r.get("error")]
        cut = [r for r in records if r.get("stream") and r.get("cut")]
        retried = sum(1 for r in records if r.get("retried"))
        seconds = result["seconds"]
        self.say(f"\nload: {len(records)} requests in {seconds:.0f} s "
                 f"({len(records) / seconds:.1f}/s), {len(failed)} failed, {len(cut)} "
                 f"streams cut of {sum(1 for r in records if r['stream'])}, {retried} sent "
                 "again after the server closed an idle keep-alive connection")
        for why, n in Counter(f"{r['status']} {r.get('error', '')[:160]}"
                              for r in failed).most_common(8):
            self.say(f"  failed {n}x: {why}")
        for model in sorted({r["model"] for r in records}):
            took = sorted(r["took"] for r in records if r["model"] == model)
            p99 = took[min(len(took) - 1, int(0.99 * len(took)))]
            self.say(f"  {model:7s} {len(took):5d} requests, median {statistics.median(took):.3f}"
                     f" s, p99 {p99:.2f} s, longest {took[-1]:.2f} s")
        journal = self.ct.journal(GATEWAY, since_cursor=result["cursor"])
        swaps = [line for line in journal.splitlines() if ": swapping " in line]
        self.say(f"  swaps: {len(swaps)} ({len(swaps) / seconds * 60:.1f}/min)"
                 + (f"; the first: {swaps[0].split(': ', 1)[-1][:300]}" if swaps else ""))
        restart, long = result["restart"], result["long"]
        if restart:
            self.say(f"  gateway restart {restart['at']:.0f} s in, during a {LONG}-token "
                     f"stream to hot: took {restart['took']:.1f} s; the stream: status "
                     f"{long.get('status')}, {long.get('events')} events in "
                     f"{long.get('took', 0):.1f} s, finish {long.get('finish')}, cut "
                     f"{long.get('cut')}, "
                     f"error {long.get('error', '-')}")
        memory = result["memory"]
        if memory:
            self.say(f"  gateway RSS: {min(memory) / 1024:.0f}-{max(memory) / 1024:.0f} MiB "
                     f"over {len(memory)} samples (each second; the restart's new process "
                     f"too), peak of the last process {self.gateway_kib('VmHWM') / 1024:.0f} MiB")
        boot = self.ct.run(["journalctl", "-b", "--no-pager", "-q", "-o", "cat"],
                           timeout=120).stdout
        limits = [x for x in boot.splitlines() if "start-limit-hit" in x
                  or "Start request repeated too quickly" in x]
        blind = sum(1 for x in boot.splitlines() if "Stats are blind" in x)
        tracebacks = boot.count("Traceback (most recent call last)")
        failed_units = self.ct.systemctl("list-units", "--failed", "--plain", "--no-legend",
                                         check=False).stdout.split("\n")
        failed_units = [u.split()[0] for u in failed_units if u.strip()]
        self.say(f"  journal: {len(limits)} start-limit lines, {blind} 'Stats are blind', "
                 f"{tracebacks} tracebacks; failed units: {failed_units or 'none'}")
        if failed or cut or limits or failed_units or tracebacks or (
                restart and (long.get("status") != 200 or long.get("cut"))):
            self.failed = True

    # by hand, as an attacker -------------------------------------------------------------

    def probes(self) -> None:
        try:
            self._probes()
        except Exception as e:   # said, and the walk goes on to the package's removal
            self.failed = True
            self.say(f"  the probes stopped: {type(e).__name__}: {e}")

    def _probes(self) -> None:
        gw = f"http://127.0.0.1:{self.port}"
        chat = '{"model":"alpha","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
        self.say("\nprobes, by hand:")
        upstream_cursor = self.ct.cursor()
        for path in ("/v1/../../admin/x?model=remote", "/v1/%2e%2e/%2e%2e/admin/x?model=remote",
                     "/v1/..%2f..%2fadmin/x?model=remote", "/v1%2F..%2F..%2Fadmin?model=remote"):
            code, body, _ = self.curl("--path-as-is", gw + path)
            self.say(f"  GET {path}: {code} {body[:100]!r}")
        reached = [x for x in self.ct.journal(UPSTREAM, since_cursor=upstream_cursor)
                   .splitlines() if "admin" in x]
        self.say(f"  the external API's log names /admin: {len(reached)} lines")
        for what in ("/slots/0?action=save&model=alpha", "/slots?model=alpha"):
            code, body, _ = self.curl("-X", "POST" if "action" in what else "GET",
                                      "-H", "Content-Type: application/json",
                                      "--data-binary", '{"filename":"x.bin","model":"alpha"}'
                                      if "action" in what else "", gw + what)
            self.say(f"  {what}: {code} {body[:100]!r}")
        code, body, head = self.curl("-H", "Origin: http://evil.example", "-H",
                                     "Content-Type: text/plain", "--data-binary", chat,
                                     gw + "/v1/chat/completions")
        acao = [x for x in head.splitlines() if x.lower().startswith("access-control")]
        self.say(f"  a page of http://evil.example posts a chat: {code}, "
                 f"Access-Control headers: {acao or 'none'}")
        # 63 MiB of {} in ~64 KiB of gzip, the model after them (gateway_hostile.py's)
        self.ct.write_file("/tmp/bomb.py", "import gzip, sys\nsys.stdout.buffer.write(gzip."
                           "compress(b'{\"m\": [' + b'{},' * (21 * 2**20) + "
                           "b'{}], \"model\": \"alpha\"}'))\n")
        self.ct.run(["sh", "-c", "python3 /tmp/bomb.py > /tmp/bomb.gz"], timeout=120)
        size = self.ct.run(["stat", "-c", "%s", "/tmp/bomb.gz"]).stdout.strip()
        before = self.gateway_kib("VmHWM")
        code, body, _ = self.curl("-H", "Content-Encoding: gzip", "-H",
                                  "Content-Type: application/json", "--data-binary",
                                  "@/tmp/bomb.gz", gw + "/v1/chat/completions")
        after = self.gateway_kib("VmHWM")
        self.say(f"  a gzip bomb of {int(size) / 1024:.0f} KiB (63 MiB inflated): {code} "
                 f"{body[:90]!r}; the gateway's peak RSS {before / 1024:.0f} -> "
                 f"{after / 1024:.0f} MiB")
        deep = '{"model":"alpha","messages":' + "[" * 1000 + "]" * 1000 + "}"
        self.ct.write_file("/tmp/deep.json", deep)
        code, body, _ = self.curl("-H", "Content-Type: application/json", "--data-binary",
                                  "@/tmp/deep.json", gw + "/v1/chat/completions")
        self.say(f"  JSON 1,000 deep: {code} {body[:100]!r}")
        code, body, _ = self.curl("-H", "Content-Type: application/json", "--data-binary",
                                  chat.replace("alpha", "lost"), gw + "/v1/chat/completions")
        self.say(f"  a broken preset: {code} {body[:160]!r}")
        code, body, _ = self.curl(gw + "/v1/models")
        leaks = [p for p in ("/etc/loki", self.model_dir, "/var/lib/loki", "/run/loki")
                 if p in body]
        self.say(f"  /v1/models: {code}, ids {[m['id'] for m in json.loads(body)['data']]}, "
                 f"server paths in it: {leaks or 'none'}")
        self.ct.write_file("/tmp/trickle.py", TRICKLE)
        r = self.ct.run(["python3", "/tmp/trickle.py", str(self.port)], timeout=120, check=False)
        self.say(f"  a body sent a byte per 5 s: after {r.stdout.strip() or r.stderr[-200:]}")

    # apt remove and purge with clients at work ---------------------------------------------

    def remove_and_purge(self) -> None:
        ct = self.ct
        for step in ("remove", "purge"):
            if step == "purge":
                ct.run(["dpkg", "--configure", "-a"], check=False)
            slots = ct.run(["sh", "-c", "ls /var/lib/loki/slots 2>/dev/null | wc -l"]
                           ).stdout.strip()
            client = ct.popen(["python3", f"{TOOLS}/team_client.py", "--port",
                               str(self.port), "--seconds", "20", "--out", "/tmp/rm.json"])
            time.sleep(8)
            t0 = time.monotonic()
            # cockpit-lokid has no conffiles: removed, nothing of it is left to purge
            pkgs = ["lokid", "cockpit-lokid"] if step == "remove" else ["lokid"]
            r = ct.run(["apt-get", "-q", "-y", step, *pkgs], check=False,
                       timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"})
            took = time.monotonic() - t0
            client.proc.wait(timeout=120)
            client.stop()
            left = ct.run(["sh", "-c", "ps -eo user:20,pid,args | awk '$1==\"loki\" || "
                           "$1==\"loki-gateway\" || /lokid (daemon|gateway)/' | "
                           "grep -v awk"], check=False).stdout.strip()
            units = ct.run(["sh", "-c", "systemctl list-units --plain --no-legend "
                            "'loki*' 'lokid*' | grep -v ' inactive ' || true"]).stdout.strip()
            rm = json.loads(ct.run(["cat", "/tmp/rm.json"], check=False).stdout or "{}")
            records = rm.get("records", [])
            ok = sum(1 for x in records if x["status"] == 200 and not x.get("error"))
            state = ct.run(["sh", "-c", "ls -A /var/lib/loki 2>/dev/null | tr '\\n' ' '"]
                           ).stdout.strip()
            self.say(f"\napt-get {step} ({r.returncode}) in {took:.1f} s with 8 clients at "
                     f"work ({len(records)} requests, {ok} answered; {slots} slot files "
                     f"before): processes left: {left or 'none'}; loaded units not inactive: "
                     f"{units or 'none'}; /var/lib/loki: {state or '(gone)'}")
            if r.returncode or left or units or (step == "purge" and state):
                self.failed = True
                self.say(r.stdout[-2000:] + r.stderr[-1000:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--restart-at", type=float, default=None,
                    help="seconds into the load (default: midway; 0: no restart)")
    ap.add_argument("--deb", action="store_true",
                    help="build the .debs on Debian 13 and install them there with apt")
    ap.add_argument("--probes", action="store_true")
    args = ap.parse_args()
    restart_at = args.seconds / 2 if args.restart_at is None else args.restart_at
    with tempfile.TemporaryDirectory() as tmp:
        model = gen.write_llama(Path(tmp) / "llama.gguf")
        binds = {ENGINE_DIR: os.path.dirname(engine_binary()),
                 TOOLS: str(ROOT / "benchmarks")}
        if args.deb:
            from support.debpkg import build_in_container, runtime_packages
            t0 = time.monotonic()
            build = build_in_container("trixie", Path(tmp))
            if build.rc != 0:
                print(build.log[-4000:])
                return 1
            print(f"built lokid {build.version} on Debian 13 in {time.monotonic() - t0:.0f} s;"
                  f" lintian: {build.lintian.strip() or 'nothing'}", flush=True)
            binds["/debs"] = tmp
            ct = Container(suite="trixie", packages=runtime_packages("trixie"), binds=binds)
        else:
            binds["/opt/lokid"] = str(REPO)
            ct = Container(binds=binds)
        ct.start()
        try:
            if args.deb:
                ct.run(["apt-get", "-q", "update"], timeout=600)
                debs = [f"/debs/{p.name}" for p in Path(tmp).glob("*.deb")]
                r = ct.run(["apt-get", "-q", "-y", "install", *debs], timeout=900,
                           env={"DEBIAN_FRONTEND": "noninteractive"})
                print(f"apt-get install {' '.join(os.path.basename(d) for d in debs)}: "
                      f"{r.returncode}", flush=True)
                model_dir = "/srv/models"
                ct.run(["mkdir", "-p", model_dir])
                ct.write_file(f"{model_dir}/llama.gguf", model.read_bytes())
            else:
                from support.lokid_install import MODEL_DIR, install
                install(ct, f"{ENGINE_DIR}/{os.path.basename(engine_binary())}",
                        [str(model)], gateway=True)
                model_dir = MODEL_DIR
            walk = Walk(ct, args.deb, model_dir)
            walk.configure()
            walk.report_load(walk.load(args.seconds, args.threads, restart_at))
            if args.probes:
                walk.probes()
            if args.deb:
                walk.remove_and_purge()
        finally:
            ct.stop()
    print("\nresult:", "FAILED" if walk.failed else "ok")
    return 1 if walk.failed else 0


if __name__ == "__main__":
    sys.exit(main())
