"""``lokictl keys``: the real lokictl against ``lokid daemon`` (a process) on a private real
dbus-daemon (issue 46, item 1); its pure parts (durations, dates, options) without a bus."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemonproc import daemon_on_bus
from support.enginekit import write_config

from lokid.core.serve import keys as corekeys
from lokid.ctl.client import CtlError
from lokid.ctl.keys import duration, expiry, options
from lokid.ctl.main import parse_args

NOW = 1_800_000_000   # 2027-01-15T08:00:00Z


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1h", 3600),
                                          ("30d", 30 * 86400), ("2w", 14 * 86400)])
def test_durations(text: str, seconds: int) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text,when", [
    ("30d", NOW + 30 * 86400), ("never", 0),
    ("2027-01-31", 1_801_353_600),                 # midnight UTC
    ("2027-01-31T12:00:00Z", 1_801_396_800),
    ("2027-01-31T12:00:00+01:00", 1_801_393_200),
])
def test_expiry(text: str, when: int) -> None:
    assert expiry(text, NOW) == when


@pytest.mark.parametrize("bad", ["soon", "30", "1y", "31/01/2027", ""])
def test_a_bad_expiry_or_duration_is_a_usage_error(bad: str) -> None:
    with pytest.raises(CtlError) as exc:
        expiry(bad, NOW)
    assert exc.value.code == 2 and "--expires" in str(exc.value)
    with pytest.raises(CtlError):
        duration(bad)


def test_flags_become_the_apis_options() -> None:
    args = vars(parse_args(["keys", "change", "bob", "--models", "a, b*", "--class", "batch",
                            "--rpm", "60", "--no-tpm", "--tokens-per-month", "0",
                            "--expires", "1h"]))
    got = {k: (v.signature, v.value) for k, v in options(args, NOW).items()}
    assert got == {"models": ("as", ["a", "b*"]), "class": ("s", "batch"),
                   "requests_per_minute": ("t", 60), "tokens_per_minute": ("t", 0),
                   "tokens_per_month": ("t", 0), "expires": ("x", NOW + 3600)}
    assert options(vars(parse_args(["keys", "change", "bob", "--models", "*"])), NOW)[
        "models"].value == ["*"]
    assert options(vars(parse_args(["keys", "add", "bob"])), NOW) == {}
    with pytest.raises(CtlError):
        options(vars(parse_args(["keys", "add", "bob", "--rpm", "-1"])), NOW)


@pytest.fixture
def daemon(tmp_path: Path, engine: str, bus_address: str) -> Iterator[tuple[str, Path]]:
    config = write_config(tmp_path, engine, [tmp_path])
    with daemon_on_bus(config, tmp_path, bus_address) as address:
        yield address, config / "clients" / "keys.toml"


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, "keys",
                           *args], capture_output=True, text=True, timeout=60)


def lookup(path: Path) -> corekeys.Lookup:
    return corekeys.Lookup(corekeys.parse(path.read_text()).values())


@pytest.mark.engine
def test_the_whole_life_of_a_key(daemon: tuple[str, Path]) -> None:
    address, path = daemon
    assert lokictl(address, "list").stdout == "no keys\n"
    r = lokictl(address, "add", "alice", "--models", "qwen*,llama3", "--class", "batch",
                "--rpm", "60", "--tokens-per-day", "5000", "--expires", "30d")
    assert r.returncode == 0, r.stderr
    (secret,) = r.stdout.splitlines()          # the key alone on stdout, once
    assert "shown this once" in r.stderr and secret not in r.stderr
    assert secret not in path.read_text()
    ident, _ = lookup(path).find(secret, time.time())
    assert ident is not None and ident.name == "alice" and ident.batch
    assert ident.models == ("qwen*", "llama3") and ident.limits.requests_per_minute == 60
    assert ident.expires is not None and ident.expires > time.time() + 29 * 86400

    table = lokictl(address, "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "PREFIX", "CLASS", "STATE", "MODELS", "LIMITS",
                                "EXPIRES"]
    assert table[1].startswith("alice ") and secret[:corekeys.SHOWN_PREFIX] + "…" in table[1]
    assert "rpm=60 tokens-per-day=5000" in table[1] and "qwen*,llama3" in table[1]
    (row,) = json.loads(lokictl(address, "list", "--json").stdout)
    assert row["class"] == "batch" and row["state"] == "active" and "hash" not in row

    r = lokictl(address, "change", "alice", "--models", "*", "--no-rpm", "--expires", "never")
    assert r.returncode == 0 and r.stdout == "alice: changed\n", r.stderr
    ident, _ = lookup(path).find(secret, time.time())
    assert ident.models == () and ident.limits.requests_per_minute is None
    assert ident.expires is None and ident.limits.tokens_per_day == 5000

    r = lokictl(address, "rotate", "alice", "--grace", "1h")
    (new,) = r.stdout.splitlines()
    assert r.returncode == 0 and new != secret
    assert lookup(path).find(secret, time.time())[0] is not None   # in its grace
    assert lookup(path).find(new, time.time())[0] is not None

    assert lokictl(address, "revoke", "alice").stdout == "alice: revoked\n"
    assert "revoked" in lookup(path).find(new, time.time())[1]
    assert json.loads(lokictl(address, "list", "--json").stdout)[0]["state"] == "revoked"
    assert lokictl(address, "remove", "alice").stdout == "alice: removed\n"
    r = lokictl(address, "revoke", "alice")
    assert r.returncode == 4 and "no key named 'alice'" in r.stderr
    r = lokictl(address, "add", "bad/name")
    assert r.returncode == 2 and "is not valid" in r.stderr and "Traceback" not in r.stderr
    r = lokictl(address, "change", "x")
    assert r.returncode == 2 and "nothing to change" in r.stderr


def test_bash_completion_knows_the_keys_verbs(tmp_path: Path) -> None:
    from support.completion import complete

    (tmp_path / "presets").mkdir()
    assert complete("lokictl k", tmp_path) == ["keys"]
    assert complete("lokictl keys ", tmp_path) == ["add", "change", "list", "remove",
                                                   "revoke", "rotate"]
    flags = complete("lokictl keys add bob --", tmp_path)
    parser_flags = [f"--{f}" for f in ("models", "class", "max-in-flight", "rpm", "tpm",
                                       "tokens-per-day", "tokens-per-month", "expires")]
    assert flags == sorted(parser_flags)
    assert complete("lokictl keys change bob --class ", tmp_path) == ["batch", "interactive"]
    assert complete("lokictl keys rotate bob --", tmp_path) == ["--grace"]
    assert complete("lokictl keys list ", tmp_path) == ["--json"]
