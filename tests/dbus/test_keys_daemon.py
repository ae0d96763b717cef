"""The gateway's named keys managed over D-Bus (issue 46, item 1): the real daemon (local
runner) on a private real dbus-daemon, callers as other users where it matters.

What the store promises, seen from the bus: the key crosses once and the file never holds
it (only its hash, which :class:`lokid.core.serve.keys.Lookup`, the gateway's own check, then
finds); 0640 and 0750; an operator's comments kept; a broken hand edit named by its line
and left byte for byte; two writers at once both land, and a program holding the
directory's flock is waited for; every method refused to a caller without the right.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dbus_fast import DBusError, Variant
from dbus_fast.aio import MessageBus
from support import REPO
from support.apidoc import documented, members
from support.daemonkit import Running, daemon_on
from support.enginekit import write_config
from support.polkit_standin import PolkitStandIn

from lokid.core.names import ERROR_PREFIX, KEYS_INTERFACE, OBJECT_PATH
from lokid.core.serve import keys as corekeys
from lokid.dbus import access
from lokid.dbus.keys import KeysInterface, keys_file
from lokid.dbus.team import FACTORIES

pytestmark = pytest.mark.engine

METHODS = ("AddKey", "ListKeys", "ChangeKey", "RevokeKey", "RotateKey", "RemoveKey")


@pytest.fixture
def config(tmp_path: Path, engine: str) -> Path:
    return write_config(tmp_path, engine, [tmp_path])


def file_of(config: Path) -> Path:
    return config / "clients" / "keys.toml"


async def keys_iface(running: Running) -> Any:
    return await running.iface(OBJECT_PATH, KEYS_INTERFACE)


def lookup(config: Path) -> corekeys.Lookup:
    return corekeys.Lookup(corekeys.parse(file_of(config).read_text()).values())


def test_the_interface_is_documented_registered_and_guarded() -> None:
    import lokid.dbus.interfaces  # noqa: F401  (the daemon's import, which registers it)

    assert KeysInterface in FACTORIES
    iface = KeysInterface(SimpleNamespace(config_dir="/nonexistent"))
    live = iface.introspect().to_xml()
    assert members(documented()[KEYS_INTERFACE]) == members(live)
    for name in METHODS:
        # every one, ListKeys too: names, scopes and limits are the team's business
        assert getattr(KeysInterface.__dict__[name], access.ACCESS_ATTR) == access.KEYS, name
    policy = ET.parse(REPO / "data" / "dbus" / "org.lokid.Lokid1.conf").getroot()
    allowed = {a.get("send_member") for p in policy for a in p
               if a.get("send_interface") == KEYS_INTERFACE}
    assert allowed == set(METHODS)
    # /etc/loki: the packaged file; a test daemon's config dir: its own
    assert keys_file("/etc/loki") == corekeys.KEYS_FILE
    assert keys_file("/tmp/c") == "/tmp/c/clients/keys.toml"


async def test_a_key_is_shown_once_and_only_its_hash_is_kept(running: Running,
                                                             config: Path) -> None:
    keys = await keys_iface(running)
    signals: list[tuple[Any, ...]] = []
    keys.on_keys_changed(lambda *body: signals.append(body))
    expires = int(time.time()) + 86400
    secret = await keys.call_add_key("alice", {
        "models": Variant("as", ["qwen*", "llama3"]), "class": Variant("s", "batch"),
        "requests_per_minute": Variant("t", 60), "tokens_per_day": Variant("t", 5000),
        "expires": Variant("x", expires)})
    assert secret.startswith(corekeys.KEY_PREFIX) and len(secret) > 40
    path = file_of(config)
    text = path.read_text()
    assert secret not in text and secret[len(corekeys.KEY_PREFIX):] not in text
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o750"
    # the printed key works where the gateway checks it
    ident, why = lookup(config).find(secret, time.time())
    assert ident is not None and why == "", why
    assert (ident.name, ident.klass, ident.models) == ("alice", "batch", ("qwen*", "llama3"))
    assert ident.limits.requests_per_minute == 60 and ident.limits.tokens_per_day == 5000
    assert ident.allows("qwen-7b") and not ident.allows("mistral")
    assert ident.expires == expires
    assert lookup(config).find(secret + "x", time.time()) == (None, "")
    # the list: never a hash; the prefix to recognise it
    (row,) = await keys.call_list_keys()
    listed = {k: v.value for k, v in row.items()}
    assert listed["prefix"] == secret[:corekeys.SHOWN_PREFIX] and listed["state"] == "active"
    assert listed["models"] == ["qwen*", "llama3"] and listed["expires"] == expires
    assert listed["requests_per_minute"] == 60 and "max_in_flight" not in listed
    assert "sha256" not in json.dumps(listed) and secret not in json.dumps(listed)
    for _ in range(100):
        if signals:
            break
        await asyncio.sleep(0.02)
    assert signals and all(body == () for body in signals)   # a signal carries nothing
    with pytest.raises(DBusError) as exc:
        await keys.call_add_key("alice", {})
    assert exc.value.type == ERROR_PREFIX + "Busy" and "exists already" in exc.value.text


async def test_change_rotate_revoke_and_remove(running: Running, config: Path) -> None:
    keys = await keys_iface(running)
    old = await keys.call_add_key("svc", {"models": Variant("as", ["a"]),
                                          "requests_per_minute": Variant("t", 10)})
    await keys.call_change_key("svc", {"models": Variant("as", ["*"]),
                                       "requests_per_minute": Variant("t", 0),
                                       "max_in_flight": Variant("u", 2)})
    ident, _ = lookup(config).find(old, time.time())
    assert ident is not None and ident.models == () and ident.allows("anything")
    assert ident.limits.requests_per_minute is None and ident.limits.max_in_flight == 2
    # rotation with a grace: both work until then; without: the old one stops at once
    new = await keys.call_rotate_key("svc", {"grace": Variant("t", 3600)})
    now = time.time()
    assert lookup(config).find(old, now)[0] is not None
    assert lookup(config).find(new, now)[0] is not None
    assert lookup(config).find(old, now + 3601)[0] is None
    newer = await keys.call_rotate_key("svc", {})
    ident, why = lookup(config).find(new, time.time())
    assert ident is None and "rotated" in why
    assert lookup(config).find(old, time.time())[0] is None
    assert lookup(config).find(newer, time.time())[0].name == "svc"
    # revoked: refused, and still listed (its usage keeps its name)
    await keys.call_revoke_key("svc")
    ident, why = lookup(config).find(newer, time.time())
    assert ident is None and "revoked" in why
    (row,) = await keys.call_list_keys()
    assert row["state"].value == "revoked" and "revoked" in row
    with pytest.raises(DBusError) as exc:
        await keys.call_rotate_key("svc", {})
    assert exc.value.type == ERROR_PREFIX + "Busy"
    await keys.call_remove_key("svc")
    assert await keys.call_list_keys() == []
    assert "svc" not in corekeys.parse(file_of(config).read_text())
    for call in (lambda: keys.call_revoke_key("svc"), lambda: keys.call_change_key("svc", {})):
        with pytest.raises(DBusError) as exc:
            await call()
        assert exc.value.type == ERROR_PREFIX + "NotFound" and "'svc'" in exc.value.text


@pytest.mark.parametrize("name,options,fragment", [
    ("bad name", {}, "key name 'bad name' is not valid"),
    ("ok", {"rpm": Variant("t", 1)}, "unknown option 'rpm'"),
    ("ok", {"models": Variant("s", "a")}, "models: an array of strings"),
    ("ok", {"class": Variant("s", "vip")}, "class: one of interactive, batch"),
    ("ok", {"tokens_per_day": Variant("s", "5")}, "tokens_per_day: an integer"),
    ("ok", {"expires": Variant("x", 1000)}, "is past"),
    ("ok", {"models": Variant("as", [""])}, "models: at most 64"),
])
async def test_bad_input_is_refused_with_its_reason(running: Running, config: Path, name: str,
                                                    options: dict[str, Variant],
                                                    fragment: str) -> None:
    keys = await keys_iface(running)
    with pytest.raises(DBusError) as exc:
        await keys.call_add_key(name, options)
    assert exc.value.type == "org.freedesktop.DBus.Error.InvalidArgs", exc.value.text
    assert fragment in exc.value.text and "Traceback" not in exc.value.text
    assert not file_of(config).exists()


async def test_a_broken_hand_edit_is_named_and_kept(running: Running, config: Path) -> None:
    keys = await keys_iface(running)
    await keys.call_add_key("first", {})
    path = file_of(config)
    hand = "# the team's keys: ask ops before changing\n" + path.read_text()
    path.write_text(hand)
    second = await keys.call_add_key("second", {})
    kept = path.read_text()
    assert kept.startswith("# the team's keys: ask ops before changing\n")   # comment kept
    assert lookup(config).find(second, time.time())[0].name == "second"
    broken = kept + "\n[keys.third]\nhash = \"sha256:abc\"\n"
    path.write_text(broken)
    line = broken.splitlines().index('hash = "sha256:abc"') + 1
    for call in (lambda: keys.call_add_key("fourth", {}), lambda: keys.call_revoke_key("first"),
                 keys.call_list_keys):
        with pytest.raises(DBusError) as exc:
            await call()
        assert f"{path}:{line}: keys.third.hash: must be" in exc.value.text, exc.value.text
    assert path.read_text() == broken        # the operator's file, byte for byte
    path.write_text(kept + "\n[keys.third\n")
    with pytest.raises(DBusError) as exc:
        await keys.call_add_key("fourth", {})
    assert "TOML syntax error" in exc.value.text and "line" in exc.value.text
    assert path.read_text() == kept + "\n[keys.third\n"


async def test_writers_at_once_all_land(running: Running, config: Path,
                                        bus_address: str) -> None:
    clients = [await MessageBus(bus_address=bus_address).connect() for _ in range(2)]
    try:
        ifaces = []
        for client in clients:
            intro = await client.introspect("org.lokid.Lokid1", OBJECT_PATH)
            ifaces.append(client.get_proxy_object("org.lokid.Lokid1", OBJECT_PATH, intro)
                          .get_interface(KEYS_INTERFACE))
        names = [f"k{i}" for i in range(16)]
        secrets = await asyncio.gather(*(ifaces[i % 2].call_add_key(n, {})
                                         for i, n in enumerate(names)))
        found = lookup(config)
        assert sorted(found.names) == sorted(names)
        for name, secret in zip(names, secrets, strict=True):
            assert found.find(secret, time.time())[0].name == name
        # a program holding the directory's lock (flock /etc/loki/clients …) is waited for
        fd = os.open(file_of(config).parent, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            pending = asyncio.ensure_future(ifaces[0].call_add_key("late", {}))
            await asyncio.sleep(0.5)
            assert not pending.done()
            assert "late" not in file_of(config).read_text()
        finally:
            os.close(fd)
        secret = await asyncio.wait_for(pending, 30)
        assert lookup(config).find(secret, time.time())[0].name == "late"
        assert len(lookup(config).names) == 17
    finally:
        for client in clients:
            client.disconnect()


def busctl_as(address: str, groups: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                           f"--groups={groups}" if groups else "--clear-groups",
                           "busctl", "--json=short", f"--address={address}", "call",
                           "org.lokid.Lokid1", OBJECT_PATH, KEYS_INTERFACE, *args],
                          capture_output=True, text=True, timeout=60)


async def test_a_caller_without_the_right_is_refused(config: Path, tmp_path: Path,
                                                     open_bus_address: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("calling as another user (setpriv) needs root")
    # no polkitd on this bus: the manage group decides (here: users; loki in production)
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users"):
        for args in (("AddKey", "sa{sv}", "intruder", "0"), ("ListKeys",),
                     ("RevokeKey", "s", "x"), ("RemoveKey", "s", "x"),
                     ("RotateKey", "sa{sv}", "x", "0"), ("ChangeKey", "sa{sv}", "x", "0")):
            r = await asyncio.to_thread(busctl_as, open_bus_address, "", *args)
            assert r.returncode != 0, (args, r.stdout)
            assert f"{args[0]} needs root or membership of group 'users'" in r.stderr, r.stderr
        assert not file_of(config).exists()
        r = await asyncio.to_thread(busctl_as, open_bus_address, "users", "AddKey", "sa{sv}",
                                    "member", "0")
        assert r.returncode == 0, r.stderr
        secret = json.loads(r.stdout)["data"][0]
        assert lookup(config).find(secret, time.time())[0].name == "member"


@pytest.mark.parametrize("allowed,ok", [
    ({"org.lokid.lokid1.manage"}, False),   # what the gateway's own user is given
    ({"org.lokid.lokid1.manage-keys"}, True),
])
async def test_where_polkit_runs_its_own_action_decides(config: Path, tmp_path: Path,
                                                        open_bus_address: str,
                                                        allowed: set[str], ok: bool) -> None:
    if os.geteuid() != 0:
        pytest.skip("calling as another user (setpriv) needs root")
    polkit_bus = await MessageBus(bus_address=open_bus_address).connect()
    stand_in = PolkitStandIn(allowed)
    polkit_bus.export("/org/freedesktop/PolicyKit1/Authority", stand_in)
    await polkit_bus.request_name("org.freedesktop.PolicyKit1")
    try:
        async with daemon_on(config, tmp_path, open_bus_address, manage_group="users"):
            # nobody in the manage group: with polkit on the bus, only its answer counts
            r = await asyncio.to_thread(busctl_as, open_bus_address, "users", "ListKeys")
    finally:
        polkit_bus.disconnect()
    assert (r.returncode == 0) is ok, r.stderr
    if not ok:
        assert "not authorized by polkit for org.lokid.lokid1.manage-keys" in r.stderr
    assert [action for _, action, _ in stand_in.calls] == ["org.lokid.lokid1.manage-keys"]


async def test_the_file_is_the_one_the_gateway_reads(running: Running, config: Path,
                                                     tmp_path: Path) -> None:
    keys = await keys_iface(running)
    await keys.call_add_key("here", {})
    assert "here" in lookup(config).names     # the default: <config>/clients/keys.toml
    elsewhere = tmp_path / "elsewhere" / "team.toml"
    with open(config / "lokid.toml", "a") as f:
        f.write(f"[gateway]\nkeys_file = \"{elsewhere}\"\n")
    secret = await keys.call_add_key("there", {})   # read at each call: no restart
    found = corekeys.Lookup(corekeys.parse(elsewhere.read_text()).values())
    assert found.find(secret, time.time())[0].name == "there"
    assert "there" not in lookup(config).names
    text = (config / "lokid.toml").read_text().replace(str(elsewhere), "")
    (config / "lokid.toml").write_text(text)
    with pytest.raises(DBusError) as exc:
        await keys.call_list_keys()
    assert exc.value.type == ERROR_PREFIX + "NotFound"
    assert 'keys_file is "" in' in exc.value.text and "lokid.toml" in exc.value.text
