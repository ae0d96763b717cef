"""An external preset under a real systemd (issue 22, item 5): a second real llama-server
on loopback with ``--api-key`` is the external API; the generator gives it no engine
unit and its api_key_file (0600 root) reaches the socket-activated
``loki-gateway.service`` as credential ``preset-key.<preset>``, which the gateway's own
user reads; a request through the gateway is answered, ``lokictl presets`` says the API
answers, and the key is in no journal line, no D-Bus property and no unit setting.

Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.enginekit import free_port
from support.lokid_install import CONFIG_DIR, MODEL_DIR, LokidSystem, curl, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

SOCKET, SERVICE = "loki-gateway.socket", "loki-gateway.service"
UPSTREAM = "lokid-test-upstream.service"
SECRET = "sk-container-upstream-93be"
KEY_FILE = "/etc/loki/keys/remote.key"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    ct = systemd_container
    system = install(ct, container_engine, [models.llama], gateway=True)
    ct.run(["mkdir", "-p", "/etc/loki/keys"])
    ct.write_file(KEY_FILE, SECRET + "\n", mode=0o600)
    system.track_path(KEY_FILE)
    yield system
    ct.systemctl("stop", SOCKET, SERVICE, UPSTREAM, check=False)
    ct.systemctl("stop", "lokid.service", check=False)
    system.set_engine(system.engine)
    system.cleanup()




def test_an_external_api_reached_through_the_socket_activated_gateway(lk: LokidSystem) -> None:
    ct = lk.ct
    up, port = free_port(), free_port()
    # the external API: a second real llama-server that wants SECRET (a transient unit)
    ct.run(["systemd-run", f"--unit={UPSTREAM}", "--property=DynamicUser=yes", lk.engine,
            "-m", f"{MODEL_DIR}/llama.gguf", "--host", "127.0.0.1", "--port", str(up),
            "-c", "2048", "--api-key", SECRET])
    deadline = time.monotonic() + 120
    while curl(ct, f"http://127.0.0.1:{up}/health")[0] != 200:
        assert time.monotonic() < deadline, ct.journal(UPSTREAM)[-2000:]
        time.sleep(0.5)
    lk.write_preset_text("remote", f'kind = "external"\nurl = "http://127.0.0.1:{up}/v1"\n'
                         f'upstream_model = "tiny"\napi_key_file = "{KEY_FILE}"\n', reload=False)
    ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                  f"engine = {json.dumps(lk.engine)}\nmodel_dirs = [{json.dumps(MODEL_DIR)}]\n"
                  f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
    cursor = ct.cursor()
    ct.systemctl("daemon-reload")
    ct.systemctl("start", "lokid.service")
    ct.systemctl("start", SOCKET)
    ct.wait_for(SOCKET, "active", timeout=30)
    # the generator: no engine unit for it, its key a credential of the gateway's unit
    cat = ct.systemctl("cat", unit("remote"), check=False).stdout
    # ("# /path" heads each file systemctl cat shows; the unit's own comments may name one)
    assert [x for x in cat.splitlines() if x.startswith("# /") and "50-lokid-" in x
            and "journal" not in x] == [], cat
    cat = ct.systemctl("cat", SERVICE).stdout
    assert f"LoadCredential=preset-key.remote:{KEY_FILE}" in cat, cat

    code, reply = curl(ct, f"http://127.0.0.1:{port}/v1/chat/completions",
                       {"model": "remote", "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 8, "temperature": 0})
    assert code == 200, (reply, ct.journal(SERVICE, since_cursor=cursor)[-3000:])
    assert reply["choices"][0]["message"]["content"] is not None
    pid = ct.show(SERVICE, "MainPID")["MainPID"]
    assert ct.run(["ps", "-o", "user=", "-p", pid]).stdout.strip() == "loki-gateway"
    # the gateway's user cannot read the operator's file: it used systemd's copy
    r = ct.run(["setpriv", "--reuid=loki-gateway", "--regid=loki-gateway", "--clear-groups",
                "cat", KEY_FILE], check=False)
    assert r.returncode != 0
    assert ct.show(unit("remote"), "ActiveState")["ActiveState"] == "inactive"

    deadline = time.monotonic() + 30
    while True:
        code, models = curl(ct, f"http://127.0.0.1:{port}/v1/models")
        entry = next(m for m in models["data"] if m["id"] == "remote")
        if entry["lokid"]["status"].startswith("reachable"):
            break
        assert time.monotonic() < deadline, entry
        time.sleep(0.5)
    assert entry["lokid"]["state"] == "external"
    r = ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", "presets"],
               check=False, timeout=120)
    line = next(x for x in r.stdout.splitlines() if x.startswith("remote"))
    assert "external" in line and "reachable (GET" in line, r.stdout + r.stderr
    r = ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", "start",
                "remote"], check=False, timeout=120)
    assert r.returncode != 0 and "nothing runs here" in r.stderr, r.stderr

    # the key: in no journal line of lokid or the gateway, no property, no unit setting
    for name in ("lokid.service", SERVICE):
        journal = ct.journal(name, since_cursor=cursor)
        assert SECRET not in journal and "Traceback" not in journal, journal[-2000:]
    props = ct.run(["busctl", "--system", "--json=short", "call", "org.lokid.Lokid1",
                    "/org/lokid/Lokid1/preset/remote", "org.freedesktop.DBus.Properties",
                    "GetAll", "s", "org.lokid.Lokid1.Preset"]).stdout
    assert KEY_FILE in props and SECRET not in props
    assert SECRET not in ct.systemctl("show", SERVICE).stdout
    ct.systemctl("stop", SOCKET, SERVICE, UPSTREAM, check=False)
