"""Model pulls through the daemon (issue 48): the real daemon (local runner: the worker is
its child) on a private real dbus-daemon, the real ``lokictl`` as a process, and the hub's
stand-in (:mod:`support.hubstand`, a process of its own serving real GGUF files).

What an operator sees: ``lokictl pull org/repo:Q4_K_M`` puts the model and its mmproj in
the first of ``model_dirs``, checked, with progress; a second pull of the same model while
one runs is refused and names the unit; a cancelled pull keeps its part and the next one
resumes from it (a Range request); a cut is retried by the worker; a corrupt file is never
renamed into place; a gated model needs the token file, which goes nowhere else. The same
pull under real systemd from the ``.deb``: tests/packaging/test_pull_systemd.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import REPO
from support.apidoc import documented, members
from support.daemonkit import Running
from support.enginekit import write_config
from support.gatewaykit import until
from support.hubstand import hub_running, requests_log, set_faults
from support.models import write_llama

from lokid.core.names import PULLS_INTERFACE
from lokid.dbus import access
from lokid.dbus.pulls import PullsInterface
from lokid.dbus.team import FACTORIES

METHODS = ("Pull", "CancelPull", "ListPulls")
TOKEN = "hf_standin_token_0123456789"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def hub_root(tmp_path: Path) -> Path:
    """Two repositories as a hub holds them: real GGUF files of several quantisations and
    an mmproj; and one model of 6 MiB (slow enough to stop in the middle)."""
    repo = tmp_path / "hub" / "org" / "tiny-GGUF"
    repo.mkdir(parents=True)
    for quant in ("Q4_K_M", "Q8_0"):
        write_llama(repo / f"tiny-{quant}.gguf")
    write_llama(repo / "mmproj-tiny-F16.gguf", n_embd=32)
    (repo / "README.md").write_text("a model card\n")
    big = tmp_path / "hub" / "org" / "big-GGUF"
    big.mkdir(parents=True)
    (big / "big-Q4_K_M.gguf").write_bytes(b"GGUF" + os.urandom((6 << 20) - 4))
    return tmp_path / "hub"


@pytest.fixture
def hub(hub_root: Path) -> Iterator[str]:
    with hub_running(hub_root) as base:
        yield base


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def config(tmp_path: Path, models: Path) -> Path:
    # no preset, so no engine runs: a pull needs none
    return write_config(tmp_path, "/usr/bin/llama-server", [models])


@pytest.fixture
def endpoint(hub: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_ENDPOINT", hub)   # the daemon's environment, as a drop-in sets it
    return hub


async def lokictl(bus_address: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid.ctl", "--bus", "session", "--address", bus_address,
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def pulls_iface(running: Running) -> Any:
    from lokid.core.names import OBJECT_PATH

    return await running.iface(OBJECT_PATH, PULLS_INTERFACE)


def rows(listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v.value for k, v in p.items()} for p in listed]


def test_the_interface_is_documented_registered_and_guarded() -> None:
    import lokid.dbus.interfaces  # noqa: F401  (the daemon's import, which registers it)

    assert PullsInterface in FACTORIES
    live = PullsInterface(SimpleNamespace()).introspect().to_xml()
    assert members(documented()[PULLS_INTERFACE]) == members(live)
    # a pull writes gigabytes and uses the network: the manage right; the list: anyone
    assert getattr(PullsInterface.__dict__["Pull"], access.ACCESS_ATTR) == access.MANAGE
    assert getattr(PullsInterface.__dict__["CancelPull"], access.ACCESS_ATTR) == access.MANAGE
    assert getattr(PullsInterface.__dict__["ListPulls"], access.ACCESS_ATTR) == access.READ
    policy = ET.parse(REPO / "data" / "dbus" / "org.lokid.Lokid1.conf").getroot()
    allowed = {a.get("send_member") for p in policy for a in p
               if a.get("send_interface") == PULLS_INTERFACE}
    assert allowed == set(METHODS)


async def test_a_pull_puts_the_model_and_its_mmproj_in_place_with_progress(
        running: Running, bus_address: str, endpoint: str, models: Path,
        hub_root: Path) -> None:
    code, out, err = await lokictl(bus_address, "pull", "org/tiny-GGUF:Q4_K_M", "--json")
    assert code == 0, err
    reports = [json.loads(line) for line in out.splitlines()]
    assert reports[-1]["state"] == "done"
    assert "tiny-Q4_K_M.gguf" in reports[-1]["detail"]
    src = hub_root / "org" / "tiny-GGUF"
    assert sorted(p.name for p in models.iterdir()) == [".lokid-pulled",
                                                        "mmproj-tiny-F16.gguf",
                                                        "tiny-Q4_K_M.gguf"]
    for name in ("tiny-Q4_K_M.gguf", "mmproj-tiny-F16.gguf"):
        assert sha(models / name) == sha(src / name)
    (row,) = rows(await (await pulls_iface(running)).call_list_pulls())
    assert row["state"] == "done" and row["model"] == "tiny-Q4_K_M.gguf"
    assert row["directory"] == str(models) and row["reference"] == "org/tiny-GGUF:Q4_K_M"
    assert row["done"] == row["total"] == sum((src / n).stat().st_size
                                              for n in row["files"])
    # pulled again: nothing fetched (the files are there and verified)
    before = len(requests_log(endpoint))
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF:Q4_K_M")
    assert code == 0, err
    assert not [r for r in requests_log(endpoint)[before:] if "/_cdn/" in r["path"]]
    # the human form: what is pulled, then done
    assert "pulling org/tiny-GGUF:Q4_K_M" in err and "done: tiny-Q4_K_M.gguf" in err


async def test_a_cancelled_pull_keeps_its_part_and_the_next_resumes(
        running: Running, bus_address: str, endpoint: str, models: Path,
        hub_root: Path) -> None:
    pulls = await pulls_iface(running)
    set_faults(endpoint, slow=40)   # 40 ms per 64 KiB: ~4 s for 6 MiB
    code, out, err = await lokictl(bus_address, "pull", "org/big-GGUF", "--no-wait")
    assert code == 0, err
    unit = out.strip()
    assert unit.startswith("loki-pull-") and unit.endswith(".service")
    part = models / "big-Q4_K_M.gguf.part"

    async def half() -> bool:
        return part.exists() and part.stat().st_size > (1 << 20)
    await until(half, 60, "a megabyte in the part")
    # the same pull again while it runs: refused, naming the unit
    code, _, err = await lokictl(bus_address, "pull", "org/big-GGUF")
    assert code == 1 and unit in err and "already being pulled" in err, err
    code, _, err = await lokictl(bus_address, "pull", "--cancel", unit)
    assert code == 0, err

    async def stopped() -> Any:
        got = [r for r in rows(await pulls.call_list_pulls()) if r["unit"] == unit]
        return got if got and got[0]["state"] == "stopped" else None
    (row,) = await until(stopped, 60, "stopped")
    assert "pull again to resume" in row["detail"]
    kept = part.stat().st_size
    assert kept > (1 << 20) and not (models / "big-Q4_K_M.gguf").exists()
    set_faults(endpoint)
    before = len(requests_log(endpoint))
    code, _, err = await lokictl(bus_address, "pull", "org/big-GGUF")
    assert code == 0, err
    ranges = [r["range"] for r in requests_log(endpoint)[before:] if "/_cdn/" in r["path"]]
    assert ranges and ranges[0] and int(ranges[0].split("=")[1].split("-")[0]) >= kept, ranges
    assert sha(models / "big-Q4_K_M.gguf") == sha(hub_root / "org" / "big-GGUF" /
                                                  "big-Q4_K_M.gguf")
    assert not part.exists()


async def test_a_cut_is_retried_and_a_corrupt_file_is_never_put_in_place(
        running: Running, bus_address: str, endpoint: str, models: Path,
        hub_root: Path) -> None:
    # once: the worker waits 2 s and resumes; slow enough (~2 s) to report its progress
    set_faults(endpoint, cut_after=1 << 20, slow=20)
    code, out, err = await lokictl(bus_address, "pull", "org/big-GGUF", "--json")
    assert code == 0, err
    reports = [json.loads(line) for line in out.splitlines()]
    states = [r["state"] for r in reports]
    assert "waiting" in states and states[-1] == "done"
    fetched = [r["done"] for r in reports if r["state"] == "fetching"]
    assert len(fetched) >= 2 and fetched == sorted(fetched), fetched   # progress, rising
    assert sha(models / "big-Q4_K_M.gguf") == sha(hub_root / "org" / "big-GGUF" /
                                                  "big-Q4_K_M.gguf")
    set_faults(endpoint, corrupt_at=12345)
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF/tiny-Q8_0.gguf")
    assert code == 1 and "SHA-256" in err, err
    assert not list(models.glob("tiny-Q8_0*")), list(models.iterdir())


async def test_a_bad_reference_or_directory_is_refused_before_any_unit(
        running: Running, bus_address: str, endpoint: str, models: Path) -> None:
    for bad in ("org/../etc", "https://user:pw@host/x.gguf", "org", "file:///etc/passwd"):
        code, _, err = await lokictl(bus_address, "pull", bad)
        assert code == 2, (bad, err)
        assert "org/name:Q4_K_M" in err, (bad, err)   # the valid forms, shown
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF", "--dir", "relative")
    assert code == 2 and "absolute" in err, err
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF", "--dir", "/nonexistent")
    assert code == 2 and "no such directory" in err, err
    assert list(models.iterdir()) == []
    assert rows(await (await pulls_iface(running)).call_list_pulls()) == []


@pytest.fixture
def gated(hub_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with hub_running(hub_root, token=TOKEN) as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        yield base


async def test_a_gated_model_needs_the_token_file_which_goes_nowhere_else(
        running: Running, bus_address: str, gated: str, config: Path, models: Path,
        tmp_path: Path) -> None:
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF:Q8_0")
    assert code == 1 and "hf-token" in err, err
    token_file = config / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    code, out, err = await lokictl(bus_address, "pull", "org/tiny-GGUF:Q8_0", "--json")
    assert code == 0, err
    assert (models / "tiny-Q8_0.gguf").exists()
    log = requests_log(gated)
    assert any(r["auth"] for r in log if r["path"].startswith("/api/"))
    # (that a CDN on another origin never gets it: tests/host/test_hub.py)
    # nowhere else: not the reports, not the status files, not ListPulls
    assert TOKEN not in out + err
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    listed = json.dumps(rows(await (await pulls_iface(running)).call_list_pulls()))
    assert TOKEN not in listed


async def test_a_worker_killed_without_a_last_word_is_reported_failed(
        running: Running, bus_address: str, endpoint: str, models: Path,
        tmp_path: Path) -> None:
    import signal

    pulls = await pulls_iface(running)
    set_faults(endpoint, slow=40)
    code, out, err = await lokictl(bus_address, "pull", "org/big-GGUF", "--no-wait")
    assert code == 0, err
    unit = out.strip()
    folder = tmp_path / "run" / "pulls"

    async def fetching() -> Any:
        for status_file in folder.glob("*.json"):
            data = json.loads(status_file.read_text())
            return data if data.get("state") == "fetching" else None
        return None
    pid = (await until(fetching, 60, "fetching"))["pid"]
    os.kill(pid, signal.SIGKILL)   # the OOM killer's way: no "stopped", no "failed"

    async def failed() -> Any:
        got = [r for r in rows(await pulls.call_list_pulls()) if r["unit"] == unit]
        return got if got and got[0]["state"] == "failed" else None
    (row,) = await until(failed, 30, "failed")
    assert "ended before the pull did" in row["detail"] and "resume" in row["detail"]
    assert (models / "big-Q4_K_M.gguf.part").exists()   # kept for the next pull


def test_a_status_file_not_the_workers_is_not_read(tmp_path: Path) -> None:
    """/run/loki/pulls is the engines' user's too: a file planted there is not believed
    (bounded, typed), so neither the daemon's memory nor its signals' types are at stake."""
    from lokid.unit.pullworker import MAX_STATUS, read_status

    path = tmp_path / "x.json"
    good = {"reference": "org/r", "directory": "/m", "state": "fetching", "done": 5,
            "total": 10, "file": "f.gguf", "detail": "", "model": "", "files": ["f.gguf"]}
    path.write_text(json.dumps(good))
    got = read_status(str(path))
    assert got is not None and (got.state, got.done, got.total) == ("fetching", 5, 10)
    for key, bad in (("files", [1]), ("files", "f"), ("detail", 3), ("total", "10"),
                     ("done", None), ("state", ["x"])):
        path.write_text(json.dumps({**good, key: bad}))
        assert read_status(str(path)) is None, (key, bad)
    path.write_text(json.dumps({**good, "detail": "x" * MAX_STATUS}))
    assert read_status(str(path)) is None   # past the bound: cut, and no JSON


async def test_an_ended_pull_is_listed_for_a_while_only(
        running: Running, bus_address: str, endpoint: str, models: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import lokid.dbus.pulls as pulls_module

    monkeypatch.setattr(pulls_module, "KEEP_DONE", 1.0)
    code, _, err = await lokictl(bus_address, "pull", "org/tiny-GGUF:Q8_0")
    assert code == 0, err
    pulls = await pulls_iface(running)
    assert [r["state"] for r in rows(await pulls.call_list_pulls())] == ["done"]
    await asyncio.sleep(1.5)   # no pull runs: the follower has stopped turning
    assert rows(await pulls.call_list_pulls()) == []
