"""lokictl on presets that are not engines to run: an external API and broken presets
(issue 28, item 17). `top` says what each is, not "inactive"; `unload` of an external
preset says it has nothing to unload, and advises neither its logs nor a start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemonproc import daemon_on_bus
from support.enginekit import free_port, write_config, write_preset

pytestmark = pytest.mark.engine


@pytest.fixture
def daemon(tmp_path: Path, engine: str, models: Any, bus_address: str) -> Iterator[str]:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "tiny", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n')
    url = f"http://127.0.0.1:{free_port()}/v1"   # nobody there
    write_preset(config, "remote", f'kind = "external"\nurl = "{url}"\nupstream_model = "big"\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')   # an object, no plan
    write_preset(config, "garbled", 'model = "llama.gguf"\nctx = "big"\n')
    with daemon_on_bus(config, tmp_path, bus_address) as address:
        yield address


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_top_says_what_external_and_broken_presets_are(daemon: str) -> None:
    deadline = time.monotonic() + 15   # the external API's reach is checked after the load
    while True:
        rows = {r["preset"]: r for r in json.loads(lokictl(daemon, "top", "--json").stdout)}
        if rows["remote"].get("reachable") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows["tiny"]["state"] == "inactive"
    remote = rows["remote"]
    assert remote["state"] == "external" and remote["url"].endswith("/v1"), remote
    assert remote["model"] == "big" and remote["reachable"].startswith("unreachable"), remote
    assert rows["nomodel"]["state"] == "broken" and "absent.gguf" in rows["nomodel"]["error"]
    assert rows["garbled"]["state"] == "broken" and "ctx" in rows["garbled"]["error"]
    top = lokictl(daemon, "top", "--once")
    assert top.returncode == 0, top.stderr
    table = top.stdout.split("\n\n")[0]   # the presets; the devices' table follows
    assert top.stdout.split("\n\n")[1].startswith("DEVICE ")
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert lines["remote"].split()[1] == "external" and remote["url"] in lines["remote"]
    assert "unreachable" in lines["remote"]
    assert lines["nomodel"].split()[1] == "broken" and "absent.gguf" in lines["nomodel"]
    assert lines["garbled"].split()[1] == "broken"
    assert lines["tiny"].split()[1] == "inactive"


def test_unload_of_an_external_preset_says_nothing_runs_here(daemon: str) -> None:
    r = lokictl(daemon, "unload", "remote")   # it waits for the unload's job by default
    assert r.returncode != 0, r.stdout
    assert "is an external API at http://127.0.0.1:" in r.stderr, r.stderr
    assert "nothing runs here" in r.stderr, r.stderr
    assert "lokictl logs" not in r.stderr and "lokictl start" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
