"""Debian 12's systemd 252 gets no journal filter, and says nothing about one.

``LogFilterPatterns=`` (issue 45, item 9) exists from systemd 253 on; 252 logs "Unknown key
name 'LogFilterPatterns' in section 'Service', ignoring." for each line each time it loads
an engine's unit: every start, every daemon-reload, every instance, in every Debian 12
operator's journal. The patterns therefore come from lokid's unit generator, which writes
them only where ``systemctl --version`` says 253 or later (lokid.unit.systemdversion).

lokid is installed in the session's container (Debian 12) as its package will be
(tests/support/lokid_install.py: the unit file and the generator unmodified); a preset's
real engine runs while systemd reloads, and the journal since then holds no "Unknown key"
line about the engine's unit, and the generator wrote no filter. Debian 13 keeps the
filter: tests/unit/test_logfilter_systemd.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import GENERATED_DIR, LokidSystem, install, unit
from support.systemd_harness import Container

from lokid.core.telemetry.journalfilter import DROPIN_NAME, FIRST_SYSTEMD, systemd_version

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    yield system
    system.cleanup()


def test_a_reload_with_a_running_engine_logs_no_unknown_key(lk: LokidSystem) -> None:
    ct = lk.ct
    version = systemd_version(ct.run(["systemctl", "--version"]).stdout)
    assert version is not None and version < FIRST_SYSTEMD, version   # Debian 12: 252
    cursor = ct.cursor()
    port = lk.preset("quiet", 'model = "llama.gguf"\n')   # daemon-reload: the generator runs
    ct.systemctl("start", unit("quiet"))
    assert lk.health(port) == 200
    lk.reload()    # with the instance loaded: systemd parses its unit and drop-ins again
    assert lk.show("quiet", "ActiveState")["ActiveState"] == "active"
    log = ct.run(["journalctl", f"--after-cursor={cursor}", "--output=cat", "--no-pager",
                  "--quiet"]).stdout
    unknown = [line for line in log.splitlines()
               if "loki-engine@" in line and ("Unknown key" in line or "Unknown section"
                                               in line)]
    assert unknown == [], f"{len(unknown)} lines, as {unknown[0]!r}"
    # the generator ran (the preset's drop-in) and wrote no filter for this systemd
    dropins = ct.run(["find", GENERATED_DIR, "-path", "*loki-engine@*"]).stdout.split()
    assert f"{GENERATED_DIR}/{unit('quiet')}.d/50-lokid-preset.conf" in dropins, dropins
    assert not any(path.endswith(DROPIN_NAME) for path in dropins), dropins
