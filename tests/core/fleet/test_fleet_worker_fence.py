"""The RPC worker's fence (issue 45, item 7): ``IPAddressAllow=`` of loki-rpc@NAME is the
config's heads only; loopback only where the head is local (a worker on loopback, or a
loopback head written as such). It once always carried ``localhost``: a local user's
process bound to 127.0.0.1 reached a worker listening on the LAN, and holding that
connection made the head's engine fail to start ("busy"). The fence under real systemd:
tests/fleet/test_rpc_fence_systemd.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from lokid.core.errors import ConfigError
from lokid.core.fleet.worker import parse_worker, worker_dropin, worker_fence


def fence(body: str) -> tuple[str, ...]:
    return worker_fence(parse_worker(body, "/etc/loki/rpc/w.toml", "w"))


@pytest.mark.parametrize(("body", "allowed"), [
    # a worker on the LAN: its heads, and nothing local
    ('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1"]\n', ("10.0.0.1",)),
    ('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1", "10.1.0.0/16"]\n',
     ("10.0.0.1", "10.1.0.0/16")),
    # a head on this host, said by the operator: that loopback address, as written
    ('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1", "127.0.0.1"]\n',
     ("10.0.0.1", "127.0.0.1")),
    # a worker on loopback: its head is on this host
    ('listen = "127.0.0.1:50052"\n', ("localhost",)),
    ('listen = "127.0.0.1:50052"\nheads = ["127.0.0.1"]\n', ("127.0.0.1",)),
])
def test_the_fence_admits_the_configured_heads_and_loopback_only_for_a_local_head(
        body: str, allowed: tuple[str, ...]) -> None:
    assert fence(body) == allowed


def test_the_dropin_of_a_lan_worker_admits_no_loopback() -> None:
    text = worker_dropin(parse_worker('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1"]\n',
                                      "/etc/loki/rpc/gpu.toml", "gpu"))
    assert text.endswith("[Service]\nIPAddressAllow=10.0.0.1\n"), text
    assert "localhost" not in text and "127.0.0.1" not in text


def test_a_worker_on_loopback_with_only_remote_heads_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        fence('listen = "127.0.0.1:50052"\nheads = ["10.0.0.1"]\n')
    said = str(e.value)
    assert "heads" in said and "no head can reach" in said and "loopback" in said, said


def test_the_generator_writes_the_fence(tmp_path: Path) -> None:
    from lokid.unit.generator import rpc_units

    rpc = tmp_path / "rpc"
    rpc.mkdir()
    (rpc / "lan.toml").write_text('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1"]\n')
    (rpc / "local.toml").write_text('listen = "127.0.0.1:50053"\n')
    out = tmp_path / "out"
    assert rpc_units(str(tmp_path), str(out)) == ["loki-rpc@lan.service",
                                                   "loki-rpc@local.service"]
    lan = (out / "loki-rpc@lan.service.d" / "50-lokid-preset.conf").read_text()
    local = (out / "loki-rpc@local.service.d" / "50-lokid-preset.conf").read_text()
    assert "IPAddressAllow=10.0.0.1\n" in lan and "localhost" not in lan, lan
    assert "IPAddressAllow=localhost\n" in local, local
