"""lokid.store.keystore on real files: the group the gateway reads by, what a failed write
leaves, and the rules of revoke and rotate (issue 46, item 1). The D-Bus side and the
concurrent writers: tests/dbus/test_keys_daemon.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.smallfs import fill, remount, small_tmpfs
from support.users import throwaway_user

from lokid.core.errors import BusyError, ConfigError, InvalidArgsError, LokiError
from lokid.core.serve import keys as corekeys
from lokid.store.keystore import KeyStore, Options


def test_the_file_and_directory_belong_to_the_gateways_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another group needs root")
    with throwaway_user() as user:   # its own group stands in for loki-gateway
        store = KeyStore(str(tmp_path / "keys" / "keys.toml"), group=user.pw_name)
        store.add("a", Options())
        for path, mode in ((tmp_path / "keys" / "keys.toml", 0o640),
                           (tmp_path / "keys", 0o750)):
            st = path.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, user.pw_gid, mode)


def test_without_that_group_the_daemons_own(tmp_path: Path) -> None:
    store = KeyStore(str(tmp_path / "keys.toml"), group="no-such-group-lokid")
    store.add("a", Options())
    st = (tmp_path / "keys.toml").stat()
    assert st.st_gid == os.getegid() and st.st_mode & 0o777 == 0o640


def test_a_full_disk_leaves_the_file_as_it_was_and_no_temporary(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs") as fs:
        store = KeyStore(str(fs / "keys" / "keys.toml"))
        store.add("a", Options(models=("m" * 200,) * 64))
        before = (fs / "keys" / "keys.toml").read_bytes()
        fill(fs)
        with pytest.raises(LokiError) as exc:
            for i in range(100):   # the last blocks may hold a few more keys
                store.add(f"b{i}", Options(models=("m" * 200,) * 64))
        assert "cannot write" in str(exc.value) and "No space left" in str(exc.value)
        assert sorted(os.listdir(fs / "keys")) == ["keys.toml"]
        assert corekeys.parse((fs / "keys" / "keys.toml").read_text())   # whole, parses
        assert (fs / "keys" / "keys.toml").read_bytes().startswith(before[:-1])
        remount(fs, "ro")
        with pytest.raises(LokiError) as exc:
            store.revoke("a")
        assert "Read-only file system" in str(exc.value) and "ReadWritePaths" in str(exc.value)


def test_not_a_regular_file_is_said(tmp_path: Path) -> None:
    (tmp_path / "keys.toml").mkdir()
    with pytest.raises(ConfigError) as exc:
        KeyStore(str(tmp_path / "keys.toml")).add("a", Options())
    assert "is not a regular file" in str(exc.value)


def test_revoke_keeps_its_first_time_and_rotation_its_rules(tmp_path: Path) -> None:
    store = KeyStore(str(tmp_path / "keys.toml"))
    store.add("a", Options())
    store.revoke("a", now=1_900_000_000)
    store.revoke("a", now=1_900_000_500)
    (entry,) = store.entries()
    assert entry.revoked == 1_900_000_000
    with pytest.raises(BusyError):
        store.rotate("a")
    first = store.add("b", Options())
    second = store.rotate("b", grace=60)
    third = store.rotate("b", grace=60)
    lookup = corekeys.Lookup(store.entries())
    now = time.time()
    # only the key just replaced has a grace: the one before is gone
    assert lookup.find(first, now) == (None, "")
    assert lookup.find(second, now)[0] is not None and lookup.find(third, now)[0] is not None
    with pytest.raises(InvalidArgsError):
        store.rotate("b", grace=-1)


def test_options_the_gateway_would_refuse_are_refused_first(tmp_path: Path) -> None:
    store = KeyStore(str(tmp_path / "keys.toml"))
    for bad, fragment in ((Options(limits={"max_in_flight": 10 ** 16}), "max_in_flight"),
                          (Options(limits={"burst": 1}), "unknown limit 'burst'"),
                          (Options(models=("x" * 257,)), "models"),
                          (Options(klass="gold"), "class")):
        with pytest.raises(InvalidArgsError) as exc:
            store.add("a", bad)
        assert fragment in str(exc.value)
    assert not (tmp_path / "keys.toml").exists()
