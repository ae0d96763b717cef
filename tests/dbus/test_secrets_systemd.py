"""Secrets under a real systemd, the real system bus and the real polkitd (Debian 12).

A preset's API key file and token file are 0600 root in a 0700 directory: systemd
loads them as the unit's credentials, the engine (user loki) gets the key as a file
and the token in its environment, and neither is in any process's argv, the unit's
settings, the journal or the runtime plan. Over the bus a user outside group loki
reads a key typed into extra_args masked; a member of group loki (polkit's rules)
reads it in clear.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
PRESET = "org.lokid.Lokid1.Preset"
KEY = "sk-container-key-31b7e0"
TOKEN = "hf_container_token_9c2d"
TYPED = "sk-typed-into-extra-args-44"
KEYS = "/etc/loki/keys"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    ct = systemd_container
    ct.run(["install", "-d", "-m", "0700", KEYS])
    ct.write_file(f"{KEYS}/tok.key", KEY + "\n", mode=0o600)
    ct.write_file(f"{KEYS}/hf", TOKEN + "\n", mode=0o600)
    system.track_path(KEYS)
    system.tok_port = system.preset(  # type: ignore[attr-defined]
        "tok", f'model = "llama.gguf"\napi_key_file = "{KEYS}/tok.key"\n'
        f'[secrets]\nHF_TOKEN = "{KEYS}/hf"\n')
    system.preset("typed", f'model = "llama.gguf"\nextra_args = ["--api-key", "{TYPED}"]\n'
                  '[env]\nLLAMA_ARG_THREADS = "1"\n')
    if ct.run(["getent", "passwd", "gpuops"], check=False).returncode != 0:
        ct.run(["useradd", "--create-home", "--user-group", "--groups", "loki", "gpuops"])
    yield system
    ct.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def curl(ct: Container, port: int, *headers: str) -> str:
    args = [a for h in headers for a in ("-H", h)]
    r = ct.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                *args, f"http://127.0.0.1:{port}/v1/models"], check=False)
    return r.stdout.strip()


def test_the_engine_gets_its_secrets_as_credentials_and_nothing_shows_them(
        lk: LokidSystem) -> None:
    ct = lk.ct
    dropin = ct.run(["systemctl", "cat", unit("tok")]).stdout
    assert f"LoadCredential=api-key:{KEYS}/tok.key" in dropin
    assert f"LoadCredential=env.HF_TOKEN:{KEYS}/hf" in dropin
    ct.systemctl("start", unit("tok"), timeout=120)
    port = lk.tok_port  # type: ignore[attr-defined]
    assert curl(ct, port) == "401"
    assert curl(ct, port, f"Authorization: Bearer {KEY}") == "200"
    pid = lk.engine_pid("tok")
    argv = ct.run(["cat", f"/proc/{pid}/cmdline"]).stdout.split("\0")
    creds = "/run/credentials/loki-engine@tok.service"
    assert argv[argv.index("--api-key-file") + 1] == f"{creds}/api-key"
    environ = ct.run(["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
    assert f"HF_TOKEN={TOKEN}" in environ
    everyone = ct.run(["ps", "-eo", "args"]).stdout
    show = ct.run(["systemctl", "show", unit("tok")]).stdout
    journal = lk.journal("tok")
    plan_file = ct.read_file("/run/loki/tok.json")
    for where, text in (("ps", everyone), ("systemctl show", show), ("journal", journal),
                        ("runtime plan", plan_file), ("drop-in", dropin)):
        assert KEY not in text and TOKEN not in text, where
    assert json.loads(plan_file)["secrets"][1]["target"] == "HF_TOKEN"
    ct.systemctl("stop", unit("tok"), timeout=60)


def busctl_as(ct: Container, user: str, *args: str) -> Any:
    who = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"] if user == "nobody" else \
        [f"--reuid={user}", f"--regid={user}", "--init-groups"]
    r = ct.run(["setpriv", *who, "busctl", "--json=short", *args], check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["data"]


def test_over_the_bus_only_group_loki_reads_secret_values(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    path = "/org/lokid/Lokid1/preset/typed"

    def seen(user: str) -> dict[str, Any]:
        return {"argv": busctl_as(ct, user, "get-property", BUS, path, PRESET, "Argv"),
                "plan": busctl_as(ct, user, "call", BUS, path, PRESET, "Plan")[0],
                "all": busctl_as(ct, user, "call", BUS, path,
                                 "org.freedesktop.DBus.Properties", "GetAll", "s", PRESET)[0],
                # the Cockpit page's one read of every preset: the shipped bus policy
                # lets anyone send it, and dbus-fast answers it with masked getters
                "managed": busctl_as(ct, user, "call", BUS, "/org/lokid/Lokid1/preset",
                                     "org.freedesktop.DBus.ObjectManager",
                                     "GetManagedObjects")[0]}

    outsider = seen("nobody")
    assert outsider["argv"][outsider["argv"].index("--api-key") + 1] == "***"
    assert outsider["plan"]["env"]["data"] == {"LLAMA_ARG_THREADS": "***"}
    assert outsider["managed"][path][PRESET]["Argv"]["data"] == outsider["argv"]
    assert TYPED not in json.dumps(outsider)
    member = seen("gpuops")   # group loki: the shipped polkit rules
    assert member["argv"][member["argv"].index("--api-key") + 1] == TYPED
    assert member["all"]["Argv"]["data"] == member["argv"]
    assert member["plan"]["env"]["data"] == {"LLAMA_ARG_THREADS": "1"}
    notes = " ".join(member["plan"]["notes"]["data"])
    assert "which every local user sees in `ps`" in notes
    tok = busctl_as(ct, "nobody", "call", BUS, "/org/lokid/Lokid1/preset/tok", PRESET,
                    "Plan")[0]
    assert tok["secrets"]["data"][0]["source"]["data"] == f"{KEYS}/tok.key"
    assert KEY not in json.dumps(tok) and TOKEN not in json.dumps(tok)
    assert "Traceback" not in ct.journal("lokid.service")


def test_a_secret_given_before_daemon_reload_is_told_to_reload(lk: LokidSystem) -> None:
    """The preset's unit has no LoadCredential= until the generator runs again: its start
    says to run daemon-reload (the unit tells lokid where its credentials go, %d), rather
    than the engine's user failing on a 0600 root file; after the reload it starts."""
    ct = lk.ct
    lk.preset("late", f'model = "llama.gguf"\napi_key_file = "{KEYS}/tok.key"\n',
              reload=False)
    r = ct.systemctl("start", unit("late"), check=False, timeout=120)
    assert r.returncode != 0
    status = lk.show("late", "StatusText", "ExecMainStatus")
    assert "the unit has no credential api-key" in status["StatusText"], status
    assert "systemctl daemon-reload" in status["StatusText"], status
    assert status["ExecMainStatus"] == "78", status
    ct.systemctl("reset-failed", unit("late"), check=False)
    lk.reload()
    ct.systemctl("start", unit("late"), timeout=120)
    assert lk.show("late", "ActiveState")["ActiveState"] == "active"
    ct.systemctl("stop", unit("late"), timeout=60)
