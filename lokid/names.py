"""Names that other programs see, in one place: units, slices, journal MESSAGE_IDs,
D-Bus error names. Change one here, nowhere else."""

from __future__ import annotations

# systemd
ENGINE_UNIT_PREFIX = "loki-engine@"
ENGINE_UNIT_SUFFIX = ".service"
# Every instance of loki-engine@.service runs in this slice ("-" escaped).
ENGINE_SLICE = "system-loki\\x2dengine.slice"
SYSLOG_IDENTIFIER = "lokid"


def engine_unit(preset: str) -> str:
    return f"{ENGINE_UNIT_PREFIX}{preset}{ENGINE_UNIT_SUFFIX}"


def preset_of_unit(unit: str) -> str | None:
    """The preset of a loki-engine@<preset>.service unit name, or None."""
    if unit.startswith(ENGINE_UNIT_PREFIX) and unit.endswith(ENGINE_UNIT_SUFFIX):
        return unit[len(ENGINE_UNIT_PREFIX):-len(ENGINE_UNIT_SUFFIX)] or None
    return None


# Journal MESSAGE_IDs (sd-id128, generated once for lokid; never change them:
# operators filter on them with journalctl MESSAGE_ID=…).
MESSAGE_AUTO_CUT = "6f1c3a5e2b8d4e0a9c7b1d3f5a2e4c6b"
MESSAGE_FORMAT_UNKNOWN = "0d2b4f6a8c1e3a5b7d9f1b3d5f7a9c2e"

# D-Bus errors (the daemon's API; the error classes carry these already).
ERROR_PREFIX = "org.lokid.Lokid1.Error."
