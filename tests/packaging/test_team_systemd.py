"""The team's endpoint under real systemd, from the .deb (issue 46): named keys managed
live, usage kept across restarts and a reboot, a budget across a gateway restart, the
audit record in the journal, and the units' sandboxes with what issue 46 added; a
``systemctl reload loki-gateway`` under the team's load (issue 48, item 5).

One booted Debian 13 container (the release the package is for) with lokid's .deb
installed by apt on Debian's own libraries, lokid.service as the package enables it,
loki-gateway.socket/.service set up by lokid.toml's ``[gateway] listen``, and the real
llama-server (b11434, the host's build, bound read-only) serving two presets from GGUFs
this test generates: ``a`` on a slower model (3 layers, n_embd 384, one thread: a
stream lasts seconds, so a key can be revoked while one is in flight) and ``b`` on the
tiny one. Clients are this test's own HTTP requests (the container shares the host's
network); keys are made with the installed ``lokictl keys``, as root.

Figures printed: how long after ``lokictl keys revoke`` returned the key's next request
was refused and when the stream in flight ended (bounded only by a generous 10 s: the
machine is shared), and the gateway's memory with 1,000 more keys in the file beside its
memory without them (asserted within 5 MiB; the unit's MemoryCurrent where the host's
cgroups count it, else the process's resident set, said which).

What this found of the system as it is (asserted as such): a refusal before the
request's preset is known (a model outside the key's scope) has an empty LOKID_PRESET
in its audit record; a GatewayUsage row of a day already past the retention is never
written, so the purge is shown by cutting ``[usage] retention_days``; presets are not
started again by a reboot (on_demand unset), the gateway and the daemon are.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.debpkg import TARGET, cached_build, runtime_packages
from support.enginekit import engine_binary, free_port
from support.models import write_llama
from support.systemd_harness import Container, _say

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ENGINE_DIR = "/opt/engine"
MODEL_DIR = "/var/lib/loki-models"
KEYS = "/etc/loki/clients/keys.toml"
GATEWAY = "loki-gateway.service"
DAEMON = "lokid.service"
# Words no log line may carry: a request's prompt is the client's business.
PROMPT = "quokka-zephyr-7731 tell me about the lighthouse"
MiB = 2**20


@dataclass
class Team:
    ct: Container
    url: str
    ops: str                                   # a key that may use every model
    # the engine's own figures of every answer this test received, by key name:
    # requests, prompt_n + cache_n, cache_n, predicted_n
    seen: dict[str, list[int]] = field(default_factory=dict)
    secrets_given: list[str] = field(default_factory=list)


def lokictl(ct: Container, *args: str) -> Any:
    return ct.run(["lokictl", *args], check=False, timeout=120)


def add_key(team: Team, name: str, *options: str) -> str:
    r = lokictl(team.ct, "keys", "add", name, *options)
    assert r.returncode == 0, (r.stdout, r.stderr)
    (key,) = r.stdout.split()
    team.secrets_given.append(key)
    return str(key)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def said(ct: Container, cursor: str = "") -> str:
    return "\n".join(ct.journal(u, since_cursor=cursor or None)[-3000:]
                     for u in (DAEMON, GATEWAY))


def until(what: str, check: Any, timeout: float = 60.0, every: float = 0.05) -> float:
    """Poll ``check`` until true; the seconds it took (AssertionError naming ``what``)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:g} s"
        time.sleep(every)
    return time.monotonic() - t0


def note(team: Team, name: str, timings: dict[str, Any]) -> None:
    """Count one answer's engine figures (llama-server's ``timings``) under ``name``."""
    cache = int(timings.get("cache_n", 0))
    row = team.seen.setdefault(name, [0, 0, 0, 0])
    for i, v in enumerate((1, int(timings["prompt_n"]) + cache, cache,
                           int(timings["predicted_n"]))):
        row[i] += v


def chat(team: Team, key: str, name: str, model: str, *, max_tokens: int = 8,
         headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "seed": 1}
    r = httpx.post(f"{team.url}/v1/chat/completions", json=body, timeout=120,
                   headers=headers if headers is not None else bearer(key))
    if r.status_code == 200:
        note(team, name, r.json()["timings"])
    return r


def stream(team: Team, client: httpx.Client, key: str, model: str, max_tokens: int
           ) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "seed": 1, "stream": True,
            "ignore_eos": True}   # llama-server's own: the random model's EOS comes early
    return client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(key))


def events_of(lines: Iterator[str]) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def timings_of(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's figures: llama-server puts ``timings`` in its last chunk."""
    found: dict[str, Any] = [c for c in chunks if "timings" in c][-1]["timings"]
    return found


def usage_of(ct: Container, key: str) -> dict[str, int]:
    """``lokictl usage --json`` for one key, over every preset and day kept."""
    r = lokictl(ct, "usage", "--json", "--by", "key", "--key", key)
    assert r.returncode == 0, (r.stdout, r.stderr)
    rows = json.loads(r.stdout)
    assert len(rows) <= 1, rows
    return {k: int(v) for k, v in rows[0].items() if k != "key"} if rows else {}


def apt(ct: Container, *args: str) -> None:
    r = ct.run(["apt-get", "-q", "-y", *args], check=False, timeout=900,
               env={"DEBIAN_FRONTEND": "noninteractive"})
    assert r.returncode == 0, f"apt-get {' '.join(args)}:\n{r.stdout[-4000:]}\n{r.stderr}"


def gateway_memory(ct: Container) -> tuple[int, str]:
    """The gateway's memory: the unit's MemoryCurrent where the container's cgroup counts
    it, else its process's resident set (the host here may lack the memory controller)."""
    current = ct.show(GATEWAY, "MemoryCurrent")["MemoryCurrent"]
    if current.isdigit():
        return int(current), "MemoryCurrent"
    pid = ct.show(GATEWAY, "MainPID")["MainPID"]
    for line in ct.read_file(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024, "VmRSS (MemoryCurrent not counted here)"
    raise AssertionError(f"no VmRSS for the gateway's pid {pid}")


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory, models: Any) -> Iterator[Team]:
    b = cached_build(TARGET, tmp_path_factory.mktemp(f"deb-{TARGET}"))
    assert b.rc == 0, f"dpkg-buildpackage failed on {TARGET}:\n{b.log[-6000:]}"
    slow = write_llama(tmp_path_factory.mktemp("slow") / "slow.gguf", n_layers=3,
                       n_embd=384, n_head=6, n_head_kv=6, n_ff=1024, context_length=8192)
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary())}
    with Container(suite=TARGET, packages=runtime_packages(TARGET), binds=binds) as ct:
        apt(ct, "update")
        apt(ct, "install", f"/debs/{b.deb.name}")
        ct.write_file(f"{MODEL_DIR}/slow.gguf", slow.read_bytes())
        ct.write_file(f"{MODEL_DIR}/llama.gguf", Path(models.llama).read_bytes())
        port = free_port()
        ct.write_file("/etc/loki/lokid.toml",
                      f"engine = {json.dumps(engine)}\nmodel_dirs = [{json.dumps(MODEL_DIR)}]\n"
                      f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
        ct.write_file("/etc/loki/presets/a.toml",
                      f'port = {free_port()}\nctx = 4096\nmodel = "slow.gguf"\n'
                      'extra_args = ["-t", "1", "-np", "2"]\n')
        ct.write_file("/etc/loki/presets/b.toml",
                      f'port = {free_port()}\nctx = 2048\nmodel = "llama.gguf"\n')
        ct.systemctl("daemon-reload")
        ct.systemctl("restart", DAEMON, timeout=120)
        ct.systemctl("start", "loki-engine@a.service", "loki-engine@b.service", timeout=180)
        t = Team(ct, f"http://127.0.0.1:{port}", "")
        t.ops = add_key(t, "ops")          # keyed before the gateway's first start
        ct.systemctl("start", "loki-gateway.socket")
        ct.wait_for("loki-gateway.socket", "active", timeout=60)

        def up() -> bool:
            try:
                return httpx.get(f"{t.url}/v1/models", headers=bearer(t.ops),
                                 timeout=10).status_code == 200
            except httpx.HTTPError:
                return False
        until("the gateway answering", up, 120, 0.5)
        yield t


def test_keys_are_managed_live_through_the_packaged_gateway(team: Team) -> None:
    ct = team.ct
    assert httpx.get(f"{team.url}/v1/models", timeout=10).status_code == 401
    alice = add_key(team, "alice", "--models", "a")

    # the gateway's user reads the file the daemon just wrote, under its own sandbox
    def works() -> bool:
        return httpx.get(f"{team.url}/v1/models", headers=bearer(alice),
                         timeout=10).status_code == 200
    took = until("alice's new key taken by the running gateway", works, 10)
    r = httpx.get(f"{team.url}/v1/models", headers=bearer(alice), timeout=10)
    assert [m["id"] for m in r.json()["data"]] == ["a"], r.json()   # her scope only
    r = chat(team, alice, "alice", "a")
    assert r.status_code == 200, r.text
    r = chat(team, alice, "alice", "b")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = chat(team, alice, "alice", "a", headers={"x-api-key": alice})   # Anthropic's way
    assert r.status_code == 200, r.text
    r = httpx.post(f"{team.url}/v1/messages", timeout=120,
                   headers={"x-api-key": alice, "anthropic-version": "2023-06-01"},
                   json={"model": "a", "max_tokens": 4,
                         "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text

    # revoked while a stream of hers is in flight
    cursor = ct.cursor()
    with httpx.Client(base_url=team.url, timeout=120) as c, \
            stream(team, c, alice, "a", 600) as s:
        assert s.status_code == 200
        lines = s.iter_lines()
        first = []
        for line in lines:
            if line.startswith("data: "):
                first.append(line[len("data: "):])
                break
        r = lokictl(ct, "keys", "revoke", "alice")
        assert r.returncode == 0, (r.stdout, r.stderr)
        revoked = time.monotonic()

        def refused() -> bool:
            r = httpx.get(f"{team.url}/v1/models", headers=bearer(alice), timeout=10)
            return r.status_code == 401 and "key 'alice' was revoked" in r.text
        delay = until("alice's revoked key refused", refused, 10, 0.02)
        rest = events_of(lines)
        ended = time.monotonic() - revoked
    events = first + rest
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in e for e in chunks), chunks[-3:]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    note(team, "alice", timings_of(chunks))
    assert "Traceback" not in said(ct, cursor)
    _say(f"revocation: the key refused {delay:.2f} s after `lokictl keys revoke` "
         f"returned; her stream of {timings_of(chunks)['predicted_n']} tokens in "
         f"flight ended whole {ended:.2f} s after it; a new key worked {took:.2f} s "
         "after `lokictl keys add`")

    # rotated: the new key at once, the old one refused (no grace asked)
    r = lokictl(ct, "keys", "rotate", "ops")
    assert r.returncode == 0, (r.stdout, r.stderr)
    old, team.ops = team.ops, r.stdout.strip()
    team.secrets_given.append(team.ops)

    def rotated() -> bool:
        return (httpx.get(f"{team.url}/v1/models", headers=bearer(team.ops),
                          timeout=10).status_code == 200
                and httpx.get(f"{team.url}/v1/models", headers=bearer(old),
                              timeout=10).status_code == 401)
    until("the rotated key in force", rotated, 10)
    assert chat(team, team.ops, "ops", "b").status_code == 200


def test_the_audit_record_names_the_key_and_never_says_the_key_or_prompt(
        team: Team) -> None:
    ct = team.ct
    r = ct.run(["journalctl", "LOKID_KEY=alice", "-o", "json", "--no-pager"])
    entries = [json.loads(line) for line in r.stdout.splitlines()]
    by_status: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_status.setdefault(e["LOKID_STATUS"], []).append(e)
    ok = by_status.get("200", [])
    # her chats by Bearer and x-api-key, her Anthropic message, her stream
    assert len(ok) == 4, entries
    for e in ok:
        assert e["LOKID_PRESET"] == "a" and e["_SYSTEMD_UNIT"] == GATEWAY, e
        assert int(e["LOKID_GENERATED_TOKENS"]) > 0 and int(e["LOKID_PROMPT_TOKENS"]) > 0, e
        assert e["LOKID_WHERE"] == "local", e
    assert {e["LOKID_ROUTE"] for e in ok} >= {"/v1/chat/completions", "/v1/messages"}, ok
    # her request for a model outside her scope: no preset (never the client's string)
    assert [e["LOKID_PRESET"] for e in by_status.get("404", [])] == [""], entries
    assert {e["LOKID_GENERATED_TOKENS"] for e in ok} >= {"600"}, ok   # the stream's whole
    # nothing of a key nor of a prompt anywhere in the journal (every unit, the kernel's)
    whole = ct.run(["journalctl", "-o", "json", "--no-pager"], timeout=120).stdout
    assert PROMPT.split()[0] not in whole
    for key in team.secrets_given:
        assert key not in whole and key[-24:] not in whole, "a key in the journal"


def test_a_budget_is_kept_across_a_gateway_restart(team: Team) -> None:
    ct = team.ct
    bob = add_key(team, "bob", "--models", "b", "--tokens-per-day", "20")
    until("bob's key taken", lambda: chat(team, bob, "bob", "b", max_tokens=16)
          .status_code == 200, 10)                  # passes the budget: admitted whole
    r = chat(team, bob, "bob", "b")
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    assert "Retry-After" in r.headers
    pid = ct.show(GATEWAY, "MainPID")["MainPID"]
    ct.systemctl("restart", GATEWAY, timeout=120)
    assert ct.show(GATEWAY, "MainPID")["MainPID"] != pid
    r = chat(team, bob, "bob", "b")
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", \
        (r.text, said(ct)[-2000:])
    assert chat(team, team.ops, "ops", "b").status_code == 200   # the others go on


def test_a_reload_under_the_teams_load_fails_no_request(team: Team) -> None:
    """``systemctl reload loki-gateway`` (issue 48, item 5) while 8 clients send requests
    and a stream is in flight: a new ``cors_origins`` in force, the same process (no
    restart), not one request failed, the stream whole (a restart cut it at its drain)."""
    ct = team.ct
    origin = "http://team.example"
    assert httpx.get(f"{team.url}/v1/models", headers={**bearer(team.ops), "Origin": origin},
                     timeout=10).status_code == 403
    pid = ct.show(GATEWAY, "MainPID")["MainPID"]
    cursor = ct.cursor()
    stop = threading.Event()
    answers: list[int] = []

    def client() -> None:
        while not stop.is_set():
            try:
                answers.append(chat(team, team.ops, "ops", "b").status_code)
            except httpx.HTTPError as e:
                answers.append(-1)
                _say(f"reload: a request failed: {type(e).__name__}")

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    events: list[str] = []
    begun = threading.Event()

    def streaming() -> None:   # read as it comes: how far it was at the reload is known
        with httpx.Client(base_url=team.url, timeout=120) as c, \
                stream(team, c, team.ops, "a", 1500) as s:
            assert s.status_code == 200
            rest = b""
            for data in s.iter_bytes():   # cut at b"\n" only: the text may hold U+2028
                *lines, rest = (rest + data).split(b"\n")
                for line in lines:
                    if line.startswith(b"data: "):
                        events.append(line[len("data: "):].decode().rstrip("\r"))
                        begun.set()

    reader = threading.Thread(target=streaming)
    reader.start()
    try:
        assert begun.wait(120), "the stream did not begin"
        config = ct.read_file("/etc/loki/lokid.toml")
        ct.write_file("/etc/loki/lokid.toml", config.replace(
            "[gateway]\n", f'[gateway]\ncors_origins = ["{origin}"]\n', 1))
        ct.systemctl("reload", GATEWAY, timeout=60)
        until("the reload in force", lambda: "reloaded: cors_origins" in
              ct.journal(GATEWAY, since_cursor=cursor), 30, 0.2)
        at_reload = len(events)
        before = len(answers)   # and 8 more answered after it
        until("8 answers after the reload", lambda: len(answers) >= before + 8, 120, 0.1)
    finally:
        stop.set()
        for t in threads + [reader]:
            t.join(180)
    chunks = [json.loads(e) for e in events[:-1]]
    note(team, "ops", timings_of(chunks))
    assert 0 < at_reload < len(events), (at_reload, len(events))   # in flight across it
    assert events[-1] == "[DONE]" and not any("error" in e for e in chunks), chunks[-3:]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    failed = [a for a in answers if a != 200]
    assert answers and not failed, (len(answers), failed)
    assert ct.show(GATEWAY, "MainPID")["MainPID"] == pid   # reloaded, not restarted
    r = httpx.get(f"{team.url}/v1/models", headers={**bearer(team.ops), "Origin": origin},
                  timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == origin
    assert "Traceback" not in said(ct, cursor)
    _say(f"reload: {len(answers)} requests from 8 clients and a stream of "
         f"{timings_of(chunks)['predicted_n']} tokens across `systemctl reload "
         "loki-gateway`, 0 failed")


def test_a_keys_file_broken_by_hand_keeps_the_last_good_set(team: Team) -> None:
    ct = team.ct
    good = ct.read_file(KEYS)
    for breaking, line in (
            (["chmod", "000", KEYS], "keys.toml"),
            (["sh", "-c", f"echo '[keys.zed' >> {KEYS}"], "keys.toml"),
    ):
        cursor = ct.cursor()
        ct.run(breaking)
        try:
            ct.wait_journal(GATEWAY, "stays in force", since_cursor=cursor, timeout=10)
            time.sleep(2)    # four more looks at the file: still one line
            assert chat(team, team.ops, "ops", "b").status_code == 200
            lines = [x for x in ct.journal(GATEWAY, since_cursor=cursor).splitlines()
                     if "stays in force" in x]
            assert len(lines) == 1 and line in lines[0], lines
        finally:
            ct.write_file(KEYS, good, mode=0o640)
            ct.run(["chown", "root:loki-gateway", KEYS])
        ct.wait_journal(GATEWAY, "read again", since_cursor=cursor, timeout=10)


def test_a_thousand_keys_cost_the_gateway_little_memory(team: Team) -> None:
    ct = team.ct
    for _ in range(3):
        assert chat(team, team.ops, "ops", "b").status_code == 200
    before, what = gateway_memory(ct)
    good = ct.read_file(KEYS)
    many = "".join(f'\n[keys.load-{i:04}]\nhash = "sha256:{secrets.token_hex(32)}"\n'
                   'models = ["b"]\nclass = "batch"\ntokens_per_day = 100000\n'
                   for i in range(1000))
    cursor = ct.cursor()
    ct.write_file(KEYS, good + many, mode=0o640)
    ct.run(["chown", "root:loki-gateway", KEYS])
    try:
        ct.wait_journal(GATEWAY, "changed: ", since_cursor=cursor, timeout=10)
        for _ in range(3):
            assert chat(team, team.ops, "ops", "b").status_code == 200
        r = lokictl(ct, "keys", "list")
        assert r.returncode == 0 and "load-0999" in r.stdout, r
        after, _ = gateway_memory(ct)
    finally:
        ct.write_file(KEYS, good, mode=0o640)
        ct.run(["chown", "root:loki-gateway", KEYS])
    _say(f"the gateway's memory ({what}): {before / MiB:.1f} MiB, with 1,000 more keys "
         f"{after / MiB:.1f} MiB ({(after - before) / MiB:+.2f} MiB)")
    assert after - before < 5 * MiB, (before, after)


def test_usage_is_the_engines_figures_across_restarts_and_a_reboot(team: Team) -> None:
    ct = team.ct
    carol = add_key(team, "carol", "--models", "a,b")
    until("carol's key taken", lambda: chat(team, carol, "carol", "b").status_code == 200, 10)
    for model in ("b", "a", "a"):
        assert chat(team, carol, "carol", model, max_tokens=12).status_code == 200
    with httpx.Client(base_url=team.url, timeout=120) as c, stream(team, c, carol, "b", 24) as s:
        events = events_of(s.iter_lines())
    note(team, "carol", timings_of([json.loads(e) for e in events[:-1]]))
    requests, prompt, cached, generated = team.seen["carol"]
    assert cached > 0, team.seen   # the same prompt again: the engine's cache served some
    expected = {"requests": requests, "prompt_tokens": prompt, "cached_tokens": cached,
                "generated_tokens": generated}

    def counted() -> dict[str, int]:
        got = usage_of(ct, "carol")
        return {k: got.get(k, 0) for k in expected}
    until("carol's usage reported to the daemon", lambda: counted() == expected, 15, 0.3)

    # a day 60 days ago, as the gateway sent it then (root may call GatewayUsage); a
    # day past the retention when sent is never written, so it is sent within the
    # default 90 days, and the retention is then cut to 30: purged at the daemon's start
    old = (datetime.now(UTC).date() - timedelta(days=60)).isoformat()
    ct.run(["busctl", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
            "org.lokid.Lokid1.Usage", "GatewayUsage", "a(sssa{st})", "1",
            old, "carol", "a", "1", "requests", "5"])
    assert usage_of(ct, "carol")["requests"] == requests + 5
    config = ct.read_file("/etc/loki/lokid.toml")
    ct.write_file("/etc/loki/lokid.toml", config + "[usage]\nretention_days = 30\n")
    cursor = ct.cursor()
    ct.systemctl("restart", DAEMON, timeout=120)
    ct.wait_for(DAEMON, "active", timeout=60)
    assert counted() == expected, "across lokid.service's restart (the old day purged)"
    r = lokictl(ct, "usage", "--json", "--by", "day", "--key", "carol")
    assert old not in r.stdout and r.returncode == 0, r.stdout
    assert "older than 30 days deleted (retention_days)" in ct.journal(
        DAEMON, since_cursor=cursor)

    # the daemon's sandbox: it writes the keys file (ReadWritePaths=/etc/loki/clients)
    show = ct.show(DAEMON, "ReadWritePaths", "ProtectSystem", "ActiveState")
    assert "/etc/loki/clients" in show["ReadWritePaths"] and show["ProtectSystem"] == "strict"
    add_key(team, "dave", "--models", "b")

    ct.reboot(timeout=120)
    ct.wait_for(DAEMON, "active", timeout=120)
    assert counted() == expected, "across a reboot"
    ct.wait_for("loki-gateway.socket", "active", timeout=60)
    ct.systemctl("start", "loki-engine@b.service", timeout=180)   # not started at boot
    r = chat(team, carol, "carol", "b")    # the gateway, started by the socket, serves
    assert r.status_code == 200, (r.text, said(ct))
    requests, prompt, cached, generated = team.seen["carol"]
    expected = {"requests": requests, "prompt_tokens": prompt, "cached_tokens": cached,
                "generated_tokens": generated}
    until("counted on top of what the reboot kept", lambda: counted() == expected, 15, 0.3)
    _say(f"usage of carol: {expected} (lokictl usage = the engine's timings), kept across "
         f"lokid.service's restart and a reboot; {old} purged at retention_days = 30")
