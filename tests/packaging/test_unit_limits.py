"""Every unit the package ships, and every file the generator writes, asked how it behaves
when started many times, stopped mid-request or fed without limit (issue 28, items 1, 9
and 16).

- Start limits: systemd's default (5 starts in 10 s) counts every start, and lokid's
  units are started again in normal work: a relay at each swap of its engine, a socket
  or a service at an operator's restart, the daemon when it exits on purpose. At the
  limit a service fails with start-limit-hit and fails its socket with it: the port
  stopped listening after a few swaps (item 1). So none keeps the default; a socket's
  TriggerLimit is written out, as the guard against a service that cannot run at all.
- The gateway's stop: its drain (lokid.gateway.shutdown) fits in its TimeoutStopSec.
- The gateway's memory: bounded (MemoryHigh= below MemoryMax=).

The behaviour itself, under a real systemd: tests/gateway/test_start_limits_systemd.py
and tests/gateway/test_units_systemd.py.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
from support import REPO

from lokid.gateway.shutdown import GRACE, MAX_DRAIN
from lokid.unit.generator import generate

UNITS = sorted(p for p in (REPO / "units").iterdir() if p.suffix in (".service", ".socket"))
SIZES = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse(path: Path) -> configparser.ConfigParser:
    """A unit file's sections (the last value of a key repeated, as systemd takes most)."""
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                   comment_prefixes=("#", ";"))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text())
    return cp


def seconds(span: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", span)
    assert m, span
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_the_package_ships_the_units_these_tests_read() -> None:
    assert [p.name for p in UNITS] == ["loki-engine@.service", "loki-gateway.service",
                                       "loki-gateway.socket", "loki-gpu-nodes.service",
                                       "loki-port@.service",
                                       "loki-port@.socket", "loki-rpc@.service",
                                       "lokid.service"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_no_unit_keeps_systemds_default_start_limit(path: Path) -> None:
    unit = parse(path)
    assert unit.get("Unit", "StartLimitIntervalSec", fallback=None) == "0", path.name
    # the comment above it says why (the failure it prevents)
    text = path.read_text()
    before = text[:text.index("StartLimitIntervalSec=0")]
    assert "start limit" in before.lower().rsplit("\n\n", 1)[-1], path.name


@pytest.mark.parametrize("path", [p for p in UNITS if p.suffix == ".socket"],
                         ids=lambda p: p.name)
def test_each_socket_says_its_trigger_limit(path: Path) -> None:
    unit = parse(path)
    assert unit.get("Socket", "Accept") == "no"
    # systemd's own figures for Accept=no, written where a reader sees the choice
    assert unit.get("Socket", "TriggerLimitIntervalSec") == "2s"
    assert unit.get("Socket", "TriggerLimitBurst") == "20"


def test_the_gateways_stop_waits_for_its_drain_within_the_stop_timeout() -> None:
    unit = parse(REPO / "units" / "loki-gateway.service")
    timeout = seconds(unit.get("Service", "TimeoutStopSec"))
    assert MAX_DRAIN + GRACE < timeout < 90, timeout


def test_the_gateways_reload_is_a_sighup() -> None:
    """``systemctl reload loki-gateway`` (issue 48, item 5): without ExecReload= systemd
    refuses it ("Job type reload is not applicable"), and the only way to a new
    ``[gateway]`` was a restart, which cuts a long stream at the drain. SIGHUP to the main
    process (lokid.gateway.reload); not Type=notify-reload, which Debian 12's systemd 252
    lacks."""
    unit = parse(REPO / "units" / "loki-gateway.service")
    assert unit.get("Service", "ExecReload") == "/bin/kill -HUP $MAINPID"   # as lokid.service
    assert unit.get("Service", "Type") == "notify"


def test_the_gateways_memory_is_bounded() -> None:
    unit = parse(REPO / "units" / "loki-gateway.service")
    high, top = unit.get("Service", "MemoryHigh"), unit.get("Service", "MemoryMax")

    def size(text: str) -> int:
        return int(text[:-1]) * SIZES[text[-1]]

    assert 256 * 2**20 <= size(high) < size(top) <= 4 * 2**30, (high, top)


def test_the_generator_writes_no_limit_of_its_own(tmp_path: Path) -> None:
    """Its drop-ins add addresses, timeouts, credentials: no start or trigger limit that
    would undo the shipped units' (a drop-in's value wins)."""
    config = tmp_path / "config"
    (config / "presets").mkdir(parents=True)
    (config / "lokid.toml").write_text('engine = "/usr/bin/llama-server"\n'
                                       f'model_dirs = ["{tmp_path}"]\n'
                                       '[gateway]\nlisten = ["127.0.0.1:8000"]\n')
    (config / "presets" / "lazy.toml").write_text(
        'model = "m.gguf"\nport = 8100\n[serve]\non_demand = true\n')
    (config / "presets" / "steady.toml").write_text('model = "m.gguf"\nport = 8101\n')
    out = tmp_path / "out"
    written = generate(str(config), str(out))
    assert {"loki-engine@lazy.service", "loki-port@lazy.socket",
            "loki-gateway.socket"} <= set(written), written
    for path in out.rglob("*.conf"):
        text = path.read_text()
        assert "StartLimit" not in text and "TriggerLimit" not in text, path
