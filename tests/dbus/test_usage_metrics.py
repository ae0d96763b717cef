"""The usage interface as documented, and its Prometheus file (issue 46, item 2).

- data/dbus/org.lokid.Lokid1.xml documents exactly what ``org.lokid.Lokid1.Usage``
  exports, every method declares who may call it, and the bus policy lets each through;
- the real daemon on a real dbus-daemon writes ``lokid-usage.prom`` beside its
  ``metrics_textfile`` once the gateway reported, which the real ``promtool check
  metrics`` accepts without a lint warning, and removes it when it stops;
- the series are bounded: past :data:`lokid.watch.usageprom.MAX_PAIRS` (key, preset)
  pairs, the counts go to key ``_other``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import REPO
from support.apidoc import documented, members
from support.daemonkit import daemon_on
from support.enginekit import write_config

from lokid.core.names import OBJECT_PATH, USAGE_INTERFACE
from lokid.dbus import access
from lokid.dbus.usage import UsageInterface
from lokid.watch import usageprom

TODAY = datetime.now(UTC).date().isoformat()


def test_the_document_matches_the_exported_interface_and_each_method_says_who() -> None:
    iface = UsageInterface(SimpleNamespace())
    live = iface.introspect().to_xml()
    assert members(documented()[USAGE_INTERFACE]) == members(live)
    declared = {name: getattr(getattr(UsageInterface, name), access.ACCESS_ATTR, None)
                for name in ("GatewayUsage", "Usage", "KeyTotals")}
    assert declared == {"GatewayUsage": access.MANAGE, "Usage": access.READ,
                        "KeyTotals": access.MANAGE}
    policy = ET.parse(REPO / "data" / "dbus" / "org.lokid.Lokid1.conf").getroot()
    allowed = {(a.get("send_interface"), a.get("send_member"))
               for p in policy if p.get("context") == "default" for a in p}
    for name in declared:
        assert (USAGE_INTERFACE, name) in allowed, name


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    (tmp_path / "node-exporter").mkdir()
    text = (config / "lokid.toml").read_text().replace(
        'metrics_textfile = ""', f'metrics_textfile = "{tmp_path}/node-exporter/lokid.prom"')
    (config / "lokid.toml").write_text(text)
    return config


async def test_the_daemon_writes_the_usage_counters_promtool_accepts(
        config: Path, tmp_path: Path, bus_address: str) -> None:
    path = tmp_path / "node-exporter" / "lokid-usage.prom"
    async with daemon_on(config, tmp_path, bus_address) as running:
        u = await running.iface(OBJECT_PATH, USAGE_INTERFACE)
        await u.call_gateway_usage([
            [TODAY, "alice", "qwen", {"requests": 3, "prompt_tokens": 100, "cached_tokens": 40,
                                      "generated_tokens": 50, "wait_ms": 1500,
                                      "engine_ms": 800, "refused_429": 1}],
            [TODAY, "keys-file:0123abcd", "-", {"requests": 1, "refused_404": 1}]])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not path.exists():
            await asyncio.sleep(0.1)
        text = path.read_text()
        assert 'lokid_usage_requests_total{key="alice",preset="qwen"} 3' in text
        assert 'lokid_usage_tokens_total{key="alice",preset="qwen",kind="prompt"} 100' in text
        assert 'lokid_usage_tokens_total{key="alice",preset="qwen",kind="cached"} 40' in text
        assert 'lokid_usage_tokens_total{key="alice",preset="qwen",kind="generated"} 50' in text
        assert 'lokid_usage_refused_total{key="alice",preset="qwen",code="429"} 1' in text
        assert 'lokid_usage_wait_seconds_total{key="alice",preset="qwen"} 1.5' in text
        assert ('lokid_usage_refused_total{key="keys-file:0123abcd",preset="-",code="404"} 1'
                in text)
        if shutil.which("promtool") is None:
            pytest.skip("promtool (Debian: prometheus) not installed here")
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r
    assert not path.exists()   # no stale counts for node_exporter once the daemon is gone


def test_series_are_bounded_past_max_pairs() -> None:
    counts: dict[tuple[str, str], Counter[str]] = {}
    for i in range(usageprom.MAX_PAIRS + 50):
        pair = usageprom.pair_of(counts, f"key{i}", "qwen")
        counts.setdefault(pair, Counter())["requests"] += 1
    assert len(counts) == usageprom.MAX_PAIRS + 1
    assert counts[(usageprom.OTHER, "qwen")]["requests"] == 50
    # a pair that has its series keeps them
    assert usageprom.pair_of(counts, "key3", "qwen") == ("key3", "qwen")
    text = usageprom.render(counts)
    assert text.count("lokid_usage_requests_total{") == usageprom.MAX_PAIRS + 1
    assert usageprom.usage_path("/var/lib/prometheus/node-exporter/lokid.prom") == \
        "/var/lib/prometheus/node-exporter/lokid-usage.prom"
    assert usageprom.usage_path("") == ""
