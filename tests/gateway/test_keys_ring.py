"""lokid.gateway.keys' Keyring on real files (issue 46, item 1): the flat api_keys_file
and the named keys file together, a change in force within a second, a broken or
unreadable file keeping the last good set (said once, no key in the line), expiry,
rotation, once keyed never open again, and 1,000 keys costing one hash a request."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from lokid.core.errors import ConfigError
from lokid.core.serve import keys as core_keys
from lokid.core.serve.keys import ANONYMOUS, digest
from lokid.gateway import keys as gw_keys
from lokid.gateway.keys import Keyring, named_keys_held
from lokid.gateway.replies import GatewayError

NOW = 1_800_000_000.0   # 2027-01-15
LATER = "2027-06-30T00:00:00Z"
EARLIER = "2026-06-30T00:00:00Z"


def entry(name: str, secret: str, extra: str = "") -> str:
    return f'[keys.{name}]\nhash = "{digest(secret)}"\n{extra}\n'


def write(path: Path, text: str) -> None:
    """As lokid.store.keystore writes it: a new file renamed over the old one."""
    part = path.with_suffix(".part")
    part.write_text(text)
    os.replace(part, path)


def refused(ring: Keyring, headers: dict[str, str], now: float = NOW) -> str:
    with pytest.raises(GatewayError) as e:
        ring.identify(headers, now)
    assert e.value.status == 401 and e.value.code == "invalid_api_key"
    return e.value.message


def test_legacy_and_named_keys_together(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    write(path, entry("alice", "sk-alice", 'models = ["qwen*"]\nclass = "batch"'))
    ring = Keyring(frozenset({"flat-one"}), str(path))
    assert ring.keyed
    alice = ring.identify({"x-api-key": "sk-alice"}, NOW)
    assert alice.name == "alice" and alice.batch and alice.models == ("qwen*",)
    flat = ring.identify({"Authorization": "flat-one"}, NOW)   # bare, the flat file's
    assert flat.name == "keys-file:" + digest("flat-one")[7:15] and not flat.models
    assert ring.identify({"Authorization": "Bearer sk-alice"}, NOW) == alice
    message = refused(ring, {"Authorization": "Bearer sk-nobody"})
    assert "sk-nobody" not in message and "valid API key is required" in message
    assert "x-api-key" in refused(ring, {})


def test_a_keyless_gateway_is_anonymous_whatever_is_sent(tmp_path: Path) -> None:
    ring = Keyring(frozenset(), str(tmp_path / "absent.toml"))
    assert not ring.keyed
    assert ring.identify({"x-api-key": "anything"}, NOW) is ANONYMOUS
    assert Keyring().identify({}, NOW) is ANONYMOUS


def test_revoked_expired_and_rotated_keys_say_so(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    write(path, entry("gone", "sk-gone", f"revoked = {EARLIER}")
          + entry("old", "sk-old", f"expires = {EARLIER}")
          + entry("soon", "sk-soon", f"expires = {LATER}")
          + entry("rot", "sk-new", f'previous_hash = "{digest("sk-prev")}"\n'
                  f"previous_until = {LATER}")
          + entry("done", "sk-new2", f'previous_hash = "{digest("sk-prev2")}"\n'
                  f"previous_until = {EARLIER}"))
    ring = Keyring(frozenset(), str(path))
    assert "key 'gone' was revoked" in refused(ring, {"x-api-key": "sk-gone"})
    assert "key 'old' has expired" in refused(ring, {"x-api-key": "sk-old"})
    assert ring.identify({"x-api-key": "sk-soon"}, NOW).name == "soon"
    assert "has expired" in refused(ring, {"x-api-key": "sk-soon"}, NOW + 365 * 86400)
    # the rotated key's old one works until previous_until, then says it was rotated
    assert ring.identify({"x-api-key": "sk-prev"}, NOW).name == "rot"
    assert ring.identify({"x-api-key": "sk-new"}, NOW).name == "rot"
    assert "was rotated" in refused(ring, {"x-api-key": "sk-prev2"})
    assert ring.identify({"x-api-key": "sk-new2"}, NOW).name == "done"


def test_a_change_is_read_again_and_a_broken_file_keeps_the_last_good_set(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lokid.gateway")
    path = tmp_path / "keys.toml"
    write(path, entry("alice", "sk-alice"))
    ring = Keyring(frozenset(), str(path))
    assert not ring.refresh()   # nothing changed: not read again
    write(path, entry("alice", "sk-alice", f"revoked = {EARLIER}") + entry("bob", "sk-bob"))
    assert ring.refresh()
    assert "revoked" in refused(ring, {"x-api-key": "sk-alice"})
    assert ring.identify({"x-api-key": "sk-bob"}, NOW).name == "bob"
    # half an edit: a syntax error, then a bad value; bob stays, said once per fault
    write(path, entry("bob", "sk-bob") + "[keys.carol\n")
    assert not ring.refresh() and not ring.refresh()
    write(path, entry("bob", "sk-bob") + entry("carol", "sk-carol", 'class = "vip"'))
    assert not ring.refresh()
    assert ring.identify({"x-api-key": "sk-bob"}, NOW).name == "bob"
    refused(ring, {"x-api-key": "sk-carol"})
    broken = [r.getMessage() for r in caplog.records if "stays in force" in r.getMessage()]
    assert len(broken) == 2, broken
    assert "TOML syntax error" in broken[0] and "class" in broken[1]
    # unreadable (a directory where the file was: root reads a file of mode 0 too)
    kept = ring.entries
    path.unlink()
    path.mkdir()
    assert not ring.refresh() and ring.entries is kept
    assert "cannot read" in caplog.records[-1].getMessage()
    assert ring.identify({"x-api-key": "sk-bob"}, NOW).name == "bob"
    path.rmdir()
    write(path, entry("bob", "sk-bob") + entry("carol", "sk-carol"))
    assert ring.refresh() and ring.identify({"x-api-key": "sk-carol"}, NOW).name == "carol"
    text = caplog.text
    for secret in ("sk-alice", "sk-bob", "sk-carol"):
        assert secret not in text


def test_once_keyed_never_open_again(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    ring = Keyring(frozenset(), str(path))
    assert not ring.keyed   # no file yet: keyless
    write(path, entry("alice", "sk-alice"))
    assert ring.refresh() and ring.keyed
    path.unlink()
    assert ring.refresh() and ring.keyed and not ring.entries
    refused(ring, {"x-api-key": "sk-alice"})
    refused(ring, {})


def test_at_start_a_broken_or_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('[keys.x]\nhash = "md5:00"\n')
    with pytest.raises(ConfigError, match=f"{path}:2: keys.x.hash"):
        Keyring(frozenset(), str(path))
    with pytest.raises(ConfigError, match="keys.x.hash"):
        named_keys_held(str(path))
    path.write_text(entry("a", "sk-a") + entry("b", "sk-b"))
    assert named_keys_held(str(path)) == 2 and named_keys_held("") == 0
    assert named_keys_held(str(tmp_path / "absent")) == 0


async def test_the_watch_puts_a_revocation_in_force_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    write(path, entry("alice", "sk-alice"))
    ring = Keyring(frozenset(), str(path))
    ring.start()
    try:
        assert ring.identify({"x-api-key": "sk-alice"}).name == "alice"
        write(path, entry("alice", "sk-alice", f"revoked = {EARLIER}"))
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            try:
                ring.identify({"x-api-key": "sk-alice"})
            except GatewayError as e:
                assert "revoked" in e.message
                break
            assert loop.time() - began < 2 * 1.0, "still let in after twice the second"
            await asyncio.sleep(0.02)
    finally:
        await ring.stop()


def test_a_thousand_keys_cost_one_hash_a_request(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = [core_keys.new_secret() for _ in range(1000)]
    path = tmp_path / "keys.toml"
    write(path, "".join(entry(f"k{i:04d}", s, 'models = ["m*"]') for i, s in
                        enumerate(secrets)))
    ring = Keyring(frozenset({"flat"}), str(path))
    assert len(ring.entries) == 1000
    calls: list[str] = []
    real = core_keys.digest

    def counted(secret: str | bytes) -> str:
        calls.append("")
        return real(secret)

    monkeypatch.setattr(core_keys, "digest", counted)
    assert ring.identify({"x-api-key": secrets[777]}, NOW).name == "k0777"
    refused(ring, {"x-api-key": "sk-loki-wrong"})
    assert len(calls) == 2   # one hash each, found or not: no walk over the keys
    assert gw_keys.CHECK_EVERY <= 0.5


def test_named_keys_at_start_let_the_gateway_listen_beyond_loopback(tmp_path: Path) -> None:
    from lokid.core.serve.tables import GatewayConfig
    from lokid.gateway.settings import settings_of

    path = tmp_path / "keys.toml"
    wide = GatewayConfig(listen=("0.0.0.0:8000",), keys_file=str(path))
    with pytest.raises(ConfigError, match="beyond loopback .* add a named key"):
        settings_of(wide)   # no file: no keys
    write(path, "")
    with pytest.raises(ConfigError, match="beyond loopback"):
        settings_of(wide)   # a file with no key
    write(path, entry("alice", "sk-alice"))
    assert settings_of(wide).keys_file == str(path)
    with pytest.raises(ConfigError, match="beyond loopback"):
        settings_of(GatewayConfig(listen=("0.0.0.0:8000",), keys_file=""))


def test_the_command_starts_on_named_keys_and_refuses_a_broken_file(tmp_path: Path) -> None:
    """``lokid gateway`` itself: beyond loopback with a named key only (it goes on to the
    bus, absent here), and a keys file broken at start is exit 2 naming it, no traceback."""
    import subprocess
    import sys

    keys = tmp_path / "keys.toml"
    config = tmp_path / "config"
    config.mkdir()
    (config / "lokid.toml").write_text(f'[gateway]\nkeys_file = "{keys}"\n')

    def gateway() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(config),
                               "gateway", "--bus", "session", "--bus-address",
                               f"unix:path={tmp_path}/no-bus", "--listen", "0.0.0.0:1"],
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    r = gateway()
    assert r.returncode == 2 and "beyond loopback" in r.stderr, r.stderr
    write(keys, entry("alice", "sk-alice"))
    r = gateway()
    assert r.returncode == 2 and "cannot reach the session bus" in r.stderr, r.stderr
    assert "beyond loopback" not in r.stderr
    write(keys, entry("alice", "sk-alice") + "[keys.bob]\nhash = 7\n")
    r = gateway()
    assert r.returncode == 2 and f"{keys}:" in r.stderr and "keys.bob.hash" in r.stderr, \
        r.stderr
    assert "Traceback" not in r.stderr and "sk-alice" not in r.stderr
