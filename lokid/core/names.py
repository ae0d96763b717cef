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


def unit_object_path(unit: str) -> str:
    """systemd's D-Bus object path of a unit (bus_label_escape: every byte outside
    ``[A-Za-z0-9]`` as ``_xx``, and a leading digit too)."""
    label = "".join(c if c.isascii() and c.isalnum() and (i or not c.isdigit())
                    else "".join(f"_{b:02x}" for b in c.encode())
                    for i, c in enumerate(unit))
    return "/org/freedesktop/systemd1/unit/" + (label or "_")


def preset_of_unit(unit: str) -> str | None:
    """The preset of a loki-engine@<preset>.service unit name, or None."""
    if unit.startswith(ENGINE_UNIT_PREFIX) and unit.endswith(ENGINE_UNIT_SUFFIX):
        return unit[len(ENGINE_UNIT_PREFIX):-len(ENGINE_UNIT_SUFFIX)] or None
    return None


# Journal MESSAGE_IDs (sd-id128, generated once for lokid; never change them:
# operators filter on them with journalctl MESSAGE_ID=…).
MESSAGE_AUTO_CUT = "6f1c3a5e2b8d4e0a9c7b1d3f5a2e4c6b"
MESSAGE_FORMAT_UNKNOWN = "0d2b4f6a8c1e3a5b7d9f1b3d5f7a9c2e"
MESSAGE_ON_CPU = "3e7a1c9b5d2f4a6e8b0c2d4f6a8e1b3c"   # a GPU engine's start runs on the CPU
# journald dropped lines of an engine start: its counts are a lower bound (issue 45, item 9)
MESSAGE_LINES_LOST = "5b1e9d3c7a2f4e8b9c0d1a2b3c4d5e6f"

# D-Bus: everything derives from the API version.
API_VERSION = 1
BUS_NAME = f"org.lokid.Lokid{API_VERSION}"
OBJECT_PATH = f"/org/lokid/Lokid{API_VERSION}"
PRESET_PATH_PREFIX = OBJECT_PATH + "/preset/"
MANAGER_INTERFACE = BUS_NAME + ".Manager"
PRESET_INTERFACE = BUS_NAME + ".Preset"
KEYS_INTERFACE = BUS_NAME + ".Keys"   # the gateway's named client keys (issue 46)
USAGE_INTERFACE = BUS_NAME + ".Usage"   # who used what: the gateway's counts (issue 46)
PULLS_INTERFACE = BUS_NAME + ".Pulls"   # models fetched to the server (issue 48)
ERROR_PREFIX = BUS_NAME + ".Error."


def preset_object_path(preset: str) -> str:
    """The preset's object path, its name escaped as sd_bus_path_encode() does:
    every byte outside [A-Za-z0-9] becomes _xx (hex), so "a-b.c_d" is
    "a_2db_2ec_5fd" (the same as busctl's and systemd's own escaping)."""
    escaped = "".join(c if c.isascii() and c.isalnum() else
                      "".join(f"_{b:02x}" for b in c.encode()) for c in preset)
    return PRESET_PATH_PREFIX + (escaped or "_")


def preset_of_object_path(path: str) -> str | None:
    """The preset name of a preset object path, or None."""
    if not path.startswith(PRESET_PATH_PREFIX):
        return None
    label = path[len(PRESET_PATH_PREFIX):]
    if label == "_":
        return ""
    out = bytearray()
    i = 0
    while i < len(label):
        if label[i] == "_":
            try:
                out.append(int(label[i + 1:i + 3], 16))
            except ValueError:
                return None
            i += 3
        else:
            out += label[i].encode()
            i += 1
    return out.decode("utf-8", "replace")


# polkit actions (data/polkit/org.lokid.lokid1.policy declares them).
ACTION_MANAGE = "org.lokid.lokid1.manage"
ACTION_BENCH = "org.lokid.lokid1.bench"
ACTION_EDIT = "org.lokid.lokid1.edit-presets"
ACTION_READ_LOGS = "org.lokid.lokid1.read-logs"
ACTION_MANAGE_KEYS = "org.lokid.lokid1.manage-keys"   # the gateway's client keys (issue 46)
# The group that may manage engines and edit presets without polkit, that polkit's rules
# (data/polkit/50-lokid.rules) let in, and that a preset created over the bus belongs to
# (root:loki 0640): user loki's own group (debian/lokid.sysusers).
MANAGE_GROUP = "loki"
# The gateway's own user (loki-gateway.service): the one caller besides root that may
# report the gateway's figures (GatewayReport, lokid.dbus.sight).
GATEWAY_USER = "loki-gateway"
