"""``lokictl usage`` against the real daemon on a real private dbus-daemon (issue 46, item
2): the table by key, preset and day, the filters, ``--since 7d``, and options it cannot
read refused with exit status 2 and what would be valid."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import daemon_on
from support.enginekit import write_config

from lokid.core.names import OBJECT_PATH, USAGE_INTERFACE
from lokid.ctl.client import CtlError
from lokid.ctl.usage import day_of, groups_of

TODAY = datetime.now(UTC).date()
OLD = TODAY - timedelta(days=20)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    return write_config(tmp_path, engine, [models.dir])


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, "usage",
                           *args], capture_output=True, text=True, timeout=120)


async def test_lokictl_usage_tables_and_filters(config: Path, tmp_path: Path,
                                                bus_address: str) -> None:
    async with daemon_on(config, tmp_path, bus_address) as running:
        run = lambda *a: asyncio.to_thread(lokictl, bus_address, *a)  # noqa: E731
        r = await run()
        assert r.returncode == 0 and r.stdout.strip() == "no usage counted", r
        u = await running.iface(OBJECT_PATH, USAGE_INTERFACE)
        await u.call_gateway_usage([
            [TODAY.isoformat(), "alice", "qwen", {
                "requests": 3, "prompt_tokens": 1200, "cached_tokens": 1000,
                "generated_tokens": 50, "wait_ms": 1500, "engine_ms": 125_000,
                "refused_429": 1}],
            [OLD.isoformat(), "bob", "llama", {"requests": 2, "prompt_tokens": 7,
                                               "generated_tokens": 2, "refused_404": 2}]])
        r = await run()
        assert r.returncode == 0, r.stderr
        lines = [line.split() for line in r.stdout.splitlines()]
        assert lines[0] == ["KEY", "REQUESTS", "REFUSED", "PROMPT", "CACHED", "GENERATED",
                            "WAIT", "ENGINE"]
        assert lines[1] == ["alice", "3", "1", "1200", "1000", "50", "1.5s", "2min", "5s"]
        assert lines[2] == ["bob", "2", "2", "7", "0", "2", "0s", "0s"]
        assert lines[3] == ["total", "5", "3", "1207", "1000", "52", "1.5s", "2min", "5s"]
        r = await run("--by", "preset,day", "--since", "7d")
        assert r.returncode == 0, r.stderr
        assert [line.split()[:3] for line in r.stdout.splitlines()] == [
            ["PRESET", "DAY", "REQUESTS"], ["qwen", TODAY.isoformat(), "3"]]
        r = await run("--key", "bob", "--until", OLD.isoformat(), "--by", "day")
        assert [line.split()[:2] for line in r.stdout.splitlines()] == [
            ["DAY", "REQUESTS"], [OLD.isoformat(), "2"]]
        r = await run("--key", "carol")
        assert r.stdout.strip() == "no usage counted for this question"
        for args, said in ((("--since", "last week"), "--since 'last week': a day as "
                            "YYYY-MM-DD (UTC), today, or Nd"),
                           (("--by", "model"), "--by 'model': one or more of day, key, preset"),
                           (("--key", "../x"), "Usage: key '../x' is no key name")):
            r = await run(*args)
            assert r.returncode == 2 and said in r.stderr, r
            assert "Traceback" not in r.stderr


def test_days_as_lokictl_reads_them() -> None:
    today = date(2026, 12, 6)
    assert day_of("today", "--since", today) == "2026-12-06"
    assert day_of("1d", "--since", today) == "2026-12-06"
    assert day_of("7d", "--since", today) == "2026-11-30"
    assert day_of("2026-12-01", "--since", today) == "2026-12-01"
    for bad in ("0d", "2026-02-30", "2026-1-1", "yesterday", ""):
        with pytest.raises(CtlError) as e:
            day_of(bad, "--since", today)
        assert e.value.code == 2
    assert groups_of("key, preset") == ["key", "preset"]
    with pytest.raises(CtlError):
        groups_of("key,key")


def test_bash_completion_offers_usage_and_its_options(tmp_path: Path) -> None:
    from support.completion import complete

    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "qwen.toml").write_text('model = "m"\n')
    assert "usage" in complete("lokictl u", tmp_path)
    assert complete("lokictl usage --", tmp_path) == ["--by", "--json", "--key", "--preset",
                                                      "--since", "--until"]
    assert complete("lokictl usage --by ", tmp_path) == ["day", "key", "preset"]
    assert complete("lokictl usage --preset ", tmp_path) == ["qwen"]
