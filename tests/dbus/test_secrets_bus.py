"""Secrets over D-Bus: the real daemon on a private real dbus-daemon, callers as other users.

A caller without the edit right (here: the manage group is ``users``; the container
test checks group ``loki`` with the real polkitd) reads a preset's secret flag values
and env values masked in Plan, the Argv property, GetAll, GetManagedObjects (what the
Cockpit page reads) and PropertiesChanged; a member reads them in clear;
DraftCandidates lists nothing of a directory its caller cannot list.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import models as gen
from support.daemonkit import daemon_on
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, PRESET_INTERFACE, preset_object_path

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEY = "sk-lokid-bus-test-5d1e"
TOKEN = "hf_lokid_bus_token_77"
PATH = preset_object_path("k")


def busctl_as(address: str, groups: str, *args: str) -> Any:
    """busctl --json as nobody, with ``groups`` ("" for none); the reply's data."""
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                        f"--groups={groups}" if groups else "--clear-groups",
                        "busctl", "--json=short", f"--address={address}", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, open_tree: Path) -> Path:
    Path(models.llama)  # written
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    gen.write_draft(closed / "secret-draft.gguf")
    gen.write_draft(open_tree / "open-draft.gguf")
    config = write_config(tmp_path, engine, [models.dir, closed, open_tree])
    write_preset(config, "k", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 f'extra_args = ["--api-key", "{KEY}", "--jinja"]\n'
                 f'[env]\nHF_TOKEN = "{TOKEN}"\nGGML_SCHED_MAX_COPIES = "2"\n')
    return config


def flat(data: Any) -> str:
    return json.dumps(data)


async def test_secret_values_only_for_callers_with_the_edit_right(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users") as running:
        def read(groups: str) -> dict[str, Any]:
            return {
                "argv": busctl_as(open_bus_address, groups, "get-property", BUS_NAME, PATH,
                                  PRESET_INTERFACE, "Argv")["data"],
                "all": busctl_as(open_bus_address, groups, "call", BUS_NAME, PATH,
                                 "org.freedesktop.DBus.Properties", "GetAll", "s",
                                 PRESET_INTERFACE)["data"],
                "plan": busctl_as(open_bus_address, groups, "call", BUS_NAME, PATH,
                                  PRESET_INTERFACE, "Plan")["data"],
                # what the Cockpit page reads every preset through (one watch of the
                # preset path namespace): dbus-fast answers it itself
                "managed": busctl_as(open_bus_address, groups, "call", BUS_NAME,
                                     "/org/lokid/Lokid1/preset",
                                     "org.freedesktop.DBus.ObjectManager",
                                     "GetManagedObjects")["data"],
            }

        outsider = await asyncio.to_thread(read, "")
        argv = outsider["argv"]
        assert argv[argv.index("--api-key") + 1] == "***" and "--jinja" in argv
        assert outsider["all"][0]["Argv"]["data"] == argv
        assert outsider["all"][0]["Name"]["data"] == "k"     # the rest of GetAll as ever
        plan = outsider["plan"][0]
        assert plan["env"]["data"] == {"HF_TOKEN": "***", "GGML_SCHED_MAX_COPIES": "***"}
        assert "***" in plan["argv"]["data"]
        assert outsider["managed"][0][PATH][PRESET_INTERFACE]["Argv"]["data"] == argv
        assert KEY not in flat(outsider) and TOKEN not in flat(outsider)

        member = await asyncio.to_thread(read, "users")
        assert member["argv"][member["argv"].index("--api-key") + 1] == KEY
        assert member["all"][0]["Argv"]["data"] == member["argv"]
        assert member["plan"][0]["env"]["data"]["HF_TOKEN"] == TOKEN

        # the daemon's own client (root, this process) sees them; a signal goes to anyone
        preset = await running.iface(PATH, PRESET_INTERFACE)
        assert KEY in await preset.get_argv()
        changed: list[dict[str, Any]] = []
        props = await running.iface(PATH, "org.freedesktop.DBus.Properties")
        props.on_properties_changed(lambda _i, c, _x: changed.append(c))
        manager = await running.iface("/org/lokid/Lokid1", MANAGER_INTERFACE)
        await manager.call_reload()
        for _ in range(100):
            if any("Argv" in c for c in changed):
                break
            await asyncio.sleep(0.05)
        sent = next(c["Argv"].value for c in changed if "Argv" in c)
        assert KEY not in sent and sent[sent.index("--api-key") + 1] == "***"


async def test_draft_candidates_list_only_what_the_caller_may_list(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users") as running:
        def files(groups: str) -> list[str]:
            data = busctl_as(open_bus_address, groups, "call", BUS_NAME, "/org/lokid/Lokid1",
                             MANAGER_INTERFACE, "DraftCandidates", "s", "k")["data"][0]
            return sorted(c["file"]["data"] for c in data)

        assert await asyncio.to_thread(files, "") == ["open-draft.gguf"]
        manager = await running.iface("/org/lokid/Lokid1", MANAGER_INTERFACE)
        mine = {c["file"].value for c in await manager.call_draft_candidates("k")}
        assert {"open-draft.gguf", "secret-draft.gguf"} <= mine   # root lists every directory
    assert os.stat(tmp_path / "closed").st_mode & 0o777 == 0o700
