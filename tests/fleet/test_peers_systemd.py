"""Three lokid hosts on a private network (issue 30): booted Debian containers joined to a
bridge the test makes (support.fleetkit), each with lokid, its gateway on its own
address with client keys, peered with the two others by ``[gateway] peers`` (the peer
key a systemd credential), under real systemd.

Host a serves ``alpha``; b ``beta`` and ``shared``; c ``shared`` (all on demand). The
client is this test, on the bridge, with the client key: it asks a only. Then an RPC
worker on b that allows a only: a's connection is answered, c's is dropped by the
kernel (IPAddressAllow=); a's preset split over it serves, and the worker killed
mid-answer ends the client's stream with an error and the engine into its restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fleetkit import CLIENT_KEY, FleetHost, answered, fleet, headers, ssh_key
from support.systemd_harness import PACKAGES

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ON_DEMAND = 'model = "llama.gguf"\n[serve]\non_demand = true\n'


@pytest.fixture(scope="module")
def hosts(models: Any) -> Iterator[dict[str, FleetHost]]:
    with fleet(("a", "b", "c"), [models.llama], (*PACKAGES, "openssh-server")) as found:
        serves = {"a": ("alpha",), "b": ("beta", "shared"), "c": ("shared",)}
        for name, h in found.items():
            h.gateway([p for p in found.values() if p is not h],
                      {preset: ON_DEMAND for preset in serves[name]})
        yield found


def models_of(host: FleetHost) -> dict[str, Any]:
    r = httpx.get(host.url + "/v1/models", headers=headers(), timeout=30)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not {what} in {timeout} s")


def chat(model: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0, **more}


def peers_up(host: FleetHost) -> bool:
    lk = {m: e["lokid"] for m, e in models_of(host).items()}
    return all(f.get("state") != "unavailable" for e in lk.values()
               for f in e.get("replicas", {}).values()) and len(lk) == 3


def test_three_peered_gateways_list_route_stream_and_fail_over(
        hosts: dict[str, FleetHost]) -> None:
    a, b, c = hosts["a"], hosts["b"], hosts["c"]
    for h in hosts.values():   # every gateway lists every preset of the fleet
        until(lambda h=h: peers_up(h), 60, f"{h.name}'s peers read")
        listed = models_of(h)
        assert sorted(listed) == ["alpha", "beta", "shared"]
    assert set(models_of(a)["shared"]["lokid"]["replicas"]) == {"b", "c"}

    # beta asked of a: answered by b (its engine started there, not on a)
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("beta"), headers=headers(),
                   timeout=120)
    assert r.status_code == 200, r.text
    assert answered(b, "loki-engine@beta.service") == "active"

    # a stream through two gateways ends in full
    events = []
    with httpx.stream("POST", a.url + "/v1/chat/completions", headers=headers(),
                      json=chat("beta", stream=True, max_tokens=16), timeout=120) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events[-3:]

    # b's gateway stopped: shared answered by c, beta 503 at once naming b
    b.ct.systemctl("stop", "loki-gateway.socket", "loki-gateway.service", timeout=60)
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("shared"), headers=headers(),
                   timeout=120)
    assert r.status_code == 200, r.text
    assert answered(c, "loki-engine@shared.service") == "active"
    assert answered(b, "loki-engine@shared.service") != "active"
    t = time.monotonic()
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("beta"), headers=headers(),
                   timeout=120)
    assert r.status_code == 503, r.text
    assert "b is down" in r.json()["error"]["message"], r.text
    assert b.address not in r.text
    print(f"peers_systemd: a model only on a down peer answered 503 in "
          f"{(time.monotonic() - t) * 1000:.0f} ms")
    # a's daemon is told within a second or so (lokictl presets and top)
    until(lambda: "peer gateways:" in (shown := a.ct.run(["lokictl", "presets"]).stdout)
          and "b: DOWN" in shown, 10, "a's daemon told b is down")

    # b back: routed again
    b.ct.systemctl("start", "loki-gateway.socket", timeout=60)
    until(lambda: peers_up(a), 60, "b seen up again")
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("beta"), headers=headers(),
                   timeout=120)
    assert r.status_code == 200, r.text


def served(host: FleetHost) -> int:
    """Requests for ``shared`` the host's gateway answered (its journal's record of each,
    lokid.gateway.audit)."""
    return len(host.ct.run(["journalctl", "-t", "lokid-gateway", "--no-pager", "-o", "cat",
                            "LOKID_PRESET=shared", "LOKID_STATUS=200"],
                           check=False).stdout.splitlines())


def test_a_conversation_through_a_returns_to_the_peer_that_holds_it(
        hosts: dict[str, FleetHost]) -> None:
    """Issue 47, cache-affine routing across hosts on the bridge: a serves no ``shared``,
    b and c one engine of it each. Conversations asked of a go to b or c by their prompt;
    each next turn goes back to the peer that answered the last, whose engine reads the
    earlier turns from its cache (``timings.cache_n``): sent to the other, it would read
    the whole conversation again (each conversation's opening is its own). Both peers
    take some."""
    a, b, c = hosts["a"], hosts["b"], hosts["c"]
    for h in (b, c):   # both engines ready: none is passed over as cold
        h.ct.run(["lokictl", "start", "--wait", "shared"], timeout=180)
    until(lambda: all(f.get("state") == "ready" for f in
                      models_of(a)["shared"]["lokid"]["replicas"].values()), 60,
          "a seeing shared ready on b and c")
    before = {h.name: served(h) for h in (b, c)}
    for n in range(8):
        opening = f"Conversation {n} about the order {n * 7919}: " + "details, " * 40
        messages = [{"role": "user", "content": opening + "where is it?"}]
        r1 = httpx.post(a.url + "/v1/chat/completions", headers=headers(), timeout=120,
                        json={**chat("shared"), "messages": messages})
        assert r1.status_code == 200, r1.text
        messages += [{"role": "assistant", "content": "On its way."},
                     {"role": "user", "content": "When does it arrive?"}]
        r2 = httpx.post(a.url + "/v1/chat/completions", headers=headers(), timeout=120,
                        json={**chat("shared"), "messages": messages})
        assert r2.status_code == 200, r2.text
        t1, t2 = r1.json()["timings"], r2.json()["timings"]
        assert t2["cache_n"] >= t1["prompt_n"] + t1["cache_n"] - 1, (n, t1, t2)
    after = {h.name: served(h) for h in (b, c)}
    assert sum(after.values()) - sum(before.values()) >= 16, (before, after)
    assert all(after[h] > before[h] for h in after), (before, after)   # spread over both


def test_a_forged_hop_mark_keeps_a_request_here_and_no_client_key_reaches_a_peer(
        hosts: dict[str, FleetHost]) -> None:
    """A request through a carries the peer key to b, never the client's: b's own log of
    keys is not readable, so a key b does not know is asked of b directly (401), and a
    forged hop mark only keeps a request on the host it is sent to."""
    a, b = hosts["a"], hosts["b"]
    r = httpx.get(b.url + "/v1/models", headers=headers("not-a-key"), timeout=30)
    assert r.status_code == 401
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("beta"),
                   headers={**headers(), "Lokid-Hop": "1"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert CLIENT_KEY not in b.ct.run(["journalctl", "-u", "loki-gateway.service",
                                       "--no-pager"]).stdout


def test_an_rpc_worker_answers_the_heads_it_allows_only(hosts: dict[str, FleetHost]) -> None:
    a, b, c = hosts["a"], hosts["b"], hosts["c"]
    b.ct.run(["mkdir", "-p", "/etc/loki/rpc"])
    b.ct.write_file("/etc/loki/rpc/w.toml",
                    f'listen = "{b.address}:50052"\nheads = ["{a.address}"]\nthreads = 1\n')
    b.ct.systemctl("daemon-reload")
    b.ct.systemctl("start", "loki-rpc@w.service", timeout=60)
    probe = ("import sys; sys.path.insert(0, '/opt/lokid'); "
             "from lokid.host.rpcprobe import probe; "
             f"print(probe('{b.address}:50052', timeout=3).text())")

    def seen_from(h: FleetHost) -> str:
        return h.ct.run(["python3", "-c", probe], timeout=30).stdout.strip()

    until(lambda: "1 device" in seen_from(a), 30, "the worker answering a")
    said = seen_from(c)
    assert "1 device" not in said and ("does not answer" in said or "cannot connect" in said), \
        said
    # the head's plan shows the worker (lokid plan on a)
    # a context long enough that the answer below is still streaming when its worker dies
    a.system.write_preset_text("split", 'port = 8091\nctx = 16384\nmodel = "llama.gguf"\n'
                               f'rpc = ["{b.address}:50052"]\n')
    shown = a.ct.run(["lokid", "plan", "split"], timeout=120).stdout
    assert f"RPC workers:\n  {b.address}:50052: 1 device" in shown, shown
    # started on a, the engine serves with its layers on b's worker
    a.ct.systemctl("start", "loki-engine@split.service", timeout=180)
    status = json.loads(a.ct.run(["lokictl", "presets", "--json"]).stdout)
    assert {p["Name"]: p["State"] for p in status}["split"] == "ready", status

    # the worker killed mid-answer: the client's stream ends with an error, the engine's
    # unit fails into its restarts, and serves again once the worker is back (its own
    # Restart=on-failure, 5 s)
    def restarts() -> int:
        return int(a.ct.run(["systemctl", "show", "-P", "NRestarts",
                             "loki-engine@split.service"]).stdout.strip() or 0)

    before = restarts()
    events: list[str] = []
    with httpx.stream("POST", a.url + "/v1/chat/completions", headers=headers(), timeout=120,
                      json=chat("split", stream=True, max_tokens=16000, ignore_eos=True)) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 5:
                    b.ct.run(["systemctl", "kill", "-s", "KILL", "loki-rpc@w.service"])
    assert len(events) < 16000 and '"error"' in events[-1], events[-3:]
    assert "failed mid-answer" in events[-1], events[-1]
    until(lambda: restarts() > before, 60, "the engine's unit restarted")
    until(lambda: answered(a, "loki-engine@split.service") == "active"
          and "ready" in a.ct.run(["lokictl", "presets"]).stdout.split("split", 1)[1][:60],
          180, "the split engine ready again with its worker back")
    r = httpx.post(a.url + "/v1/chat/completions", json=chat("split"), headers=headers(),
                   timeout=120)
    assert r.status_code == 200, r.text
    b.ct.systemctl("stop", "loki-rpc@w.service", timeout=60)


def test_lokictl_reaches_a_host_over_ssh_and_that_hosts_polkit_decides(
        hosts: dict[str, FleetHost], tmp_path: Path) -> None:
    """lokictl -H user@a: real ssh to a's sshd, systemd-stdio-bridge there, a's polkit
    deciding: a member of group loki may stop a preset, another user may only read."""
    a = hosts["a"]
    key = ssh_key(tmp_path)
    for user, group in (("op", "loki"), ("guest", "")):
        a.ct.run(["useradd", "-m", "-s", "/bin/sh", *(["-G", group] if group else []), user])
        a.ct.run(["install", "-d", "-m", "0700", "-o", user, "-g", user, f"/home/{user}/.ssh"])
        a.ct.write_file(f"/home/{user}/.ssh/authorized_keys", Path(f"{key}.pub").read_text(),
                        mode=0o600)
        a.ct.run(["chown", f"{user}:{user}", f"/home/{user}/.ssh/authorized_keys"])
    a.ct.write_file("/etc/ssh/sshd_config.d/lokid-test.conf",
                    f"ListenAddress {a.address}\nPasswordAuthentication no\n")
    a.ct.run(["ssh-keygen", "-A"])
    a.ct.systemctl("restart", "ssh.service", timeout=60)
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\nexec ssh -i {key} -o StrictHostKeyChecking=no "
                   "-o UserKnownHostsFile=/dev/null -o BatchMode=yes \"$@\"\n")
    ssh.chmod(0o755)

    def lokictl(user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid.ctl", "-H", f"{user}@{a.address}",
                               *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "SYSTEMD_SSH": str(ssh)})

    r = lokictl("guest", "presets", "--json")
    assert r.returncode == 0, r.stderr   # anyone may read
    assert [p["Name"] for p in json.loads(r.stdout)][:1] == ["alpha"]
    a.ct.systemctl("start", "loki-engine@alpha.service", timeout=120)
    r = lokictl("guest", "stop", "alpha")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)   # refused by a's polkit
    assert answered(a, "loki-engine@alpha.service") == "active"
    r = lokictl("op", "stop", "alpha")
    assert r.returncode == 0, r.stderr
    assert answered(a, "loki-engine@alpha.service") != "active"
