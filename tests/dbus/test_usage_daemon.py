"""org.lokid.Lokid1.Usage with the real daemon on a real private dbus-daemon (issue 46,
item 2): the gateway's rows read back by Usage, KeyTotals and ``lokictl usage --json``,
kept across a restart of the daemon, days past ``[usage] retention_days`` deleted, a
caller other than the gateway refused, hostile rows refused whole with a clear error
(never a traceback, nothing counted), and a full disk that keeps the counts in memory
and writes them once there is room.

The rows are what the gateway sends (lokid.gateway.usage builds them); here a client
of the bus sends them as the gateway would, since what is tested is the daemon's side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError, Variant
from support.daemonkit import Running, daemon_on
from support.enginekit import write_config, write_preset

from lokid.core.names import BUS_NAME, OBJECT_PATH, USAGE_INTERFACE
from lokid.store.usage import UsageStore

TODAY = datetime.now(UTC).date()


def day(d: date) -> str:
    return d.isoformat()


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    with open(config / "lokid.toml", "a") as f:
        f.write("[usage]\nretention_days = 30\n")
    write_preset(config, "qwen", 'model = "llama.gguf"\nctx = 4096\n')
    return config


async def usage(running: Running) -> Any:
    return await running.iface(OBJECT_PATH, USAGE_INTERFACE)


def plain_rows(rows: list[dict[str, Variant]]) -> list[dict[str, Any]]:
    return [{k: v.value for k, v in r.items()} for r in rows]


async def ask(running: Running, **query: Any) -> list[dict[str, Any]]:
    q = {k: Variant("as" if k == "by" else "s", v) for k, v in query.items()}
    return plain_rows(await (await usage(running)).call_usage(q))


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=120)


ROWS = [
    [day(TODAY), "alice", "qwen", {"requests": 3, "prompt_tokens": 100, "cached_tokens": 40,
                                   "generated_tokens": 50, "wait_ms": 1500, "engine_ms": 800,
                                   "refused_429": 1}],
    [day(TODAY), "bob", "qwen", {"requests": 1, "prompt_tokens": 7, "generated_tokens": 2}],
    [day(TODAY), "keys-file:0123abcd", "-", {"requests": 1, "refused_404": 1}],
    [day(TODAY - timedelta(days=1)), "alice", "qwen", {"requests": 2, "prompt_tokens": 10,
                                                       "generated_tokens": 5}],
]


async def test_rows_are_read_back_and_kept_across_a_restart(
        config: Path, tmp_path: Path, bus_address: str) -> None:
    async with daemon_on(config, tmp_path, bus_address) as running:
        u = await usage(running)
        assert await ask(running) == []
        await u.call_gateway_usage(ROWS)
        await u.call_gateway_usage([ROWS[0]])   # a second report adds to the first
        by_key = {r["key"]: r for r in await ask(running)}
        assert set(by_key) == {"alice", "bob", "keys-file:0123abcd"}
        alice = by_key["alice"]
        assert (alice["requests"], alice["prompt_tokens"], alice["cached_tokens"],
                alice["generated_tokens"], alice["wait_ms"], alice["engine_ms"],
                alice["refused_429"], alice["refused"]) == (8, 210, 80, 105, 3000, 1600, 2, 2)
        assert by_key["keys-file:0123abcd"]["refused_404"] == 1
        # filters and groups
        today = await ask(running, since=day(TODAY), key="alice", by=["day", "preset"])
        assert today == [{"day": day(TODAY), "preset": "qwen", "requests": 6,
                          "prompt_tokens": 200, "cached_tokens": 80, "generated_tokens": 100,
                          "wait_ms": 3000, "engine_ms": 1600, "peer_requests": 0,
                          "refused_429": 2, "refused": 2}]
        assert [r["preset"] for r in await ask(running, by=["preset"])] == ["-", "qwen"]
        (total,) = await ask(running, by=[])
        assert total["requests"] == 10 and total["refused"] == 3
        # the budgets' totals: prompt + generated, today and this month
        totals = await u.call_key_totals()
        month = 15 if (TODAY - timedelta(days=1)).month == TODAY.month else 0
        assert list(totals["alice"]) == [300, 300 + month]
        assert list(totals["bob"]) == [9, 9]
        # lokictl usage --json says the same
        r = await asyncio.to_thread(lokictl, bus_address, "usage", "--json")
        assert r.returncode == 0, r.stderr
        assert {x["key"]: x["generated_tokens"] for x in json.loads(r.stdout)} == {
            "alice": 105, "bob": 2, "keys-file:0123abcd": 0}
    async with daemon_on(config, tmp_path, bus_address) as running:
        again = {r["key"]: r for r in await ask(running)}
        assert again == by_key
        totals = await (await usage(running)).call_key_totals()
        assert list(totals["alice"]) == [300, 300 + month]


async def test_days_past_the_retention_are_deleted(
        config: Path, tmp_path: Path, bus_address: str) -> None:
    first = TODAY.replace(day=1)
    old, older = TODAY - timedelta(days=31), TODAY - timedelta(days=400)
    store = UsageStore(str(tmp_path / "state"))
    store.add({(day(d), "alice", "qwen", "requests"): 1
               for d in (older, old, first, TODAY)})
    assert store.flush()
    store.close()
    async with daemon_on(config, tmp_path, bus_address) as running:   # retention_days = 30
        days = [r["day"] for r in await ask(running, by=["day"])]
        # older than 30 days: gone at the daemon's start; this month's first day is kept
        # whatever the retention (the month's budgets count it)
        assert days == sorted({day(first), day(TODAY)})
        # a report of a day past the retention is dropped, the rest of it taken
        await (await usage(running)).call_gateway_usage([
            [day(old), "bob", "qwen", {"requests": 5}],
            [day(TODAY), "bob", "qwen", {"requests": 1}]])
        assert {r["key"]: r["requests"] for r in await ask(running)} == {
            "alice": 2 if first != TODAY else 1, "bob": 1}


async def test_nothing_is_deleted_while_lokid_toml_cannot_be_read(
        config: Path, tmp_path: Path, bus_address: str,
        caplog: pytest.LogCaptureFixture) -> None:
    older = TODAY - timedelta(days=400)
    store = UsageStore(str(tmp_path / "state"))
    store.add({(day(older), "alice", "qwen", "requests"): 1})
    assert store.flush()
    store.close()
    # a typo: the retention the operator set cannot be read, so none is applied (the
    # default 90 days would delete what a longer retention keeps)
    with open(config / "lokid.toml", "a") as f:
        f.write("retention = 365\n")
    caplog.set_level(logging.INFO, "lokid.usage")
    async with daemon_on(config, tmp_path, bus_address) as running:
        assert [r["day"] for r in await ask(running, by=["day"])] == [day(older)]
        assert "no day is deleted until lokid.toml can be read" in caplog.text


def busctl_as(address: str, user: str, groups: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    """busctl as another user (setpriv: real uid, gid and supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup",
                           f"--groups={groups}" if groups else "--clear-groups",
                           "busctl", f"--address={address}", *args],
                          capture_output=True, text=True, timeout=60)


async def test_only_the_gateway_or_root_reports_and_reads_budgets(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    report = ("call", BUS_NAME, OBJECT_PATH, USAGE_INTERFACE, "GatewayUsage", "a(sssa{st})",
              "1", day(TODAY), "alice", "qwen", "1", "requests", "1000")
    totals = ("call", BUS_NAME, OBJECT_PATH, USAGE_INTERFACE, "KeyTotals")
    read = ("--json=short", "call", BUS_NAME, OBJECT_PATH, USAGE_INTERFACE, "Usage", "a{sv}",
            "0")
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users") as running:
        # a member of the manage group may not forge usage, nor read the budgets
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "users", *report)
        assert r.returncode != 0
        assert "GatewayUsage: only the gateway (user loki-gateway) or root" in r.stderr, r
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "users", *totals)
        assert r.returncode != 0 and "KeyTotals: only the gateway" in r.stderr, r
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "", *report)
        assert r.returncode != 0 and "membership of group" in r.stderr, r
        assert await ask(running) == []
        # root is the gateway here; anyone may read the counts
        await (await usage(running)).call_gateway_usage([[day(TODAY), "alice", "qwen",
                                                          {"requests": 1000}]])
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "", *read)
        assert r.returncode == 0, r.stderr
        (rows,) = json.loads(r.stdout)["data"]
        assert rows[0]["key"]["data"] == "alice" and rows[0]["requests"]["data"] == 1000


HOSTILE = [
    ([["2026-13-01", "alice", "qwen", {"requests": 1}]], "row 0: day '2026-13-01' is no such day"),
    ([["yesterday", "alice", "qwen", {"requests": 1}]], "is not a day as YYYY-MM-DD"),
    ([[day(TODAY + timedelta(days=400)), "alice", "qwen", {"requests": 1}]],
     "is after tomorrow (UTC)"),
    ([[day(TODAY), "../etc", "qwen", {"requests": 1}]], "key '../etc' is no key name"),
    ([[day(TODAY), "a" * 65, "qwen", {"requests": 1}]], "is no key name"),
    ([[day(TODAY), "al\x1b[2Jice", "qwen", {"requests": 1}]], "key 'al\\x1b[2Jice' is no key"),
    ([[day(TODAY), "alice", "q wen", {"requests": 1}]], "preset 'q wen' is no preset name"),
    ([[day(TODAY), "alice", "qwen", {"tokens": 1}]], "counter 'tokens' is not one of"),
    ([[day(TODAY), "alice", "qwen", {"refused_600": 1}]], "counter 'refused_600' is not"),
    ([[day(TODAY), "alice", "qwen", {"requests": 2 ** 64 - 1}]],
     "requests = 18446744073709551615 is more than one report can hold"),
    ([[day(TODAY), "alice", "qwen", {f"refused_{400 + i}": 1 for i in range(65)}]],
     "65 counters; at most 64"),
    ([[day(TODAY), "alice", "qwen", {"requests": 1}]] * 4097, "4097 rows; at most 4096"),
    # a good row first: a call with one bad row is refused whole
    ([[day(TODAY), "alice", "qwen", {"requests": 1}], [day(TODAY), "bob", "", {}]],
     "row 1: preset '' is no preset name"),
]


async def test_hostile_rows_are_refused_whole_with_a_clear_error(
        config: Path, tmp_path: Path, bus_address: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with daemon_on(config, tmp_path, bus_address) as running:
        u = await usage(running)
        for rows, said in HOSTILE:
            with pytest.raises(DBusError) as e:
                await u.call_gateway_usage(rows)
            assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs", e.value.text
            assert said in e.value.text, (said, e.value.text)
        # a million rows: refused on their count, and the daemon goes on
        million = [[day(TODAY), "alice", "qwen", {}]] * 1_000_000
        with pytest.raises(DBusError) as e:
            await u.call_gateway_usage(million)
        assert "1000000 rows; at most 4096" in e.value.text, e.value.text
        assert await ask(running) == []
        for bad, said in (({"since": Variant("s", "last week")}, "since 'last week' is not a"),
                          ({"by": Variant("as", ["model"])}, "by must list some of"),
                          ({"colour": Variant("s", "x")}, "unknown query key 'colour'")):
            with pytest.raises(DBusError) as e:
                await u.call_usage(bad)
            assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
            assert said in e.value.text, e.value.text
        await u.call_gateway_usage([[day(TODAY), "alice", "qwen", {"requests": 10 ** 12}]])
        assert (await ask(running))[0]["requests"] == 10 ** 12
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback" not in said and "internal error" not in said, said


async def test_a_full_disk_keeps_the_counts_and_writes_them_later(
        config: Path, tmp_path: Path, bus_address: str,
        caplog: pytest.LogCaptureFixture) -> None:
    from support.smallfs import fill, small_tmpfs

    caplog.set_level(logging.INFO, "lokid.usage")
    state = tmp_path / "state"
    with small_tmpfs(state, size="1m"):
        filler = fill(state)   # before the daemon starts: usage.db cannot even be made
        async with daemon_on(config, tmp_path, bus_address) as running:
            u = await usage(running)
            await u.call_gateway_usage(ROWS[:2])
            await u.call_gateway_usage([ROWS[1]])
            assert "cannot be opened" in caplog.text or "cannot be written" in caplog.text
            assert "No space left on device" in caplog.text, caplog.text
            # counted all the same: reads and budgets include what waits in memory
            assert {r["key"]: r["requests"] for r in await ask(running)} == {"alice": 3,
                                                                             "bob": 2}
            assert list((await u.call_key_totals())["bob"]) == [18, 18]
            filler.unlink()   # room again: the daemon writes them within a few seconds
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "is written again" not in caplog.text:
                await asyncio.sleep(0.2)
            assert "is written again" in caplog.text
            with sqlite3.connect(f"file:{state / 'usage.db'}?mode=ro", uri=True) as db:
                on_disk = dict(db.execute("SELECT key, SUM(value) FROM usage WHERE counter = "
                                          "'requests' GROUP BY key"))
            assert on_disk == {"alice": 3, "bob": 2}
        async with daemon_on(config, tmp_path, bus_address) as running:
            # written once: not again from memory at the stop
            assert {r["key"]: r["requests"] for r in await ask(running)} == {"alice": 3,
                                                                             "bob": 2}
