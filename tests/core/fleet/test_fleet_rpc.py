"""The preset key ``rpc`` (issue 30, item 2): workers checked as llama.cpp reads them,
becoming ``--rpc`` in the plan; the wire format of a worker's answers (the real worker
answers them in tests/engine/test_rpc_workers.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from lokid.core.config import files as cfg
from lokid.core.errors import ConfigError
from lokid.core.fleet import rpc
from lokid.core.fleet.rpc import WorkerView


def preset(tmp_path: Path, body: str) -> cfg.Preset:
    path = tmp_path / "presets" / "split.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('model = "m.gguf"\n' + body)
    return cfg.load_preset(str(tmp_path), "split")


def test_workers_parse_in_order(tmp_path: Path) -> None:
    p = preset(tmp_path, 'rpc = ["gpu2:50052", "10.0.0.3:50053"]\n')
    assert p.rpc == ("gpu2:50052", "10.0.0.3:50053")
    assert rpc.rpc_args(p.rpc) == ["--rpc", "gpu2:50052,10.0.0.3:50053"]
    assert preset(tmp_path, "").rpc == ()


@pytest.mark.parametrize("body,fragment", [
    ('rpc = "gpu2:50052"\n', "rpc: must be a list of workers such as [\"gpu2:50052\"], not a "
     "string"),
    ("rpc = []\n", "not an empty list"),
    ('rpc = ["gpu2"]\n', "rpc: item 0: 'gpu2': a worker is HOST:PORT"),
    ('rpc = ["[fd00::2]:50052"]\n', "no IPv6"),
    ('rpc = ["fd00::2:50052"]\n', "no IPv6"),
    ('rpc = ["gpu2:0"]\n', "the port must be 1 to 65535"),
    ('rpc = ["gpu 2:50052"]\n', "'gpu 2' is not a host name or an IPv4 address"),
    ('rpc = ["a:1", "a:1"]\n', "item 1: a:1 is listed twice"),
    ('rpc = [1]\n', "item 0 must be a string, not an integer"),
    ('rpc = ["a:1"]\nextra_args = ["--rpc", "b:2"]\n', "extra_args sets --rpc too"),
])
def test_every_bad_worker_list_names_the_key_and_what_is_valid(tmp_path: Path, body: str,
                                                               fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        preset(tmp_path, body)
    assert fragment in str(e.value), str(e.value)
    assert ":2: rpc" in str(e.value) or ":3: rpc" in str(e.value), str(e.value)


def test_the_workers_of_a_command_line() -> None:
    assert rpc.workers_of(["llama-server", "-m", "x", "--rpc", "a:1,b:2"]) == ("a:1", "b:2")
    assert rpc.workers_of(["llama-server", "--rpc=a:1"]) == ("a:1",)
    assert rpc.workers_of(["llama-server", "-m", "x"]) == ()


def test_the_wire_is_ggml_rpcs() -> None:
    """| cmd (1 byte) | size (u64 LE) | payload |, as ggml-rpc.cpp's send_rpc_cmd writes it;
    HELLO is command 14 (a static_assert there) with 24 bytes of capabilities."""
    assert rpc.hello() == bytes([14]) + struct.pack("<Q", 24) + bytes(24)
    assert rpc.device_count() == bytes([15]) + struct.pack("<Q", 0)
    assert rpc.device_memory(2) == bytes([11]) + struct.pack("<Q", 4) + struct.pack("<I", 2)
    assert rpc.read_hello(bytes([7, 0, 1, 0]) + bytes(24)) == (7, 0, 1)
    with pytest.raises(ValueError, match="protocol 6.1.0, this engine 7.x"):
        rpc.read_hello(bytes([6, 1, 0, 0]) + bytes(24))
    with pytest.raises(ValueError, match="not a ggml-rpc-server"):
        rpc.read_hello(b"HTTP/1.1 400")
    assert rpc.read_memory(struct.pack("<QQ", 5 << 30, 8 << 30)) == (5 << 30, 8 << 30)


def test_what_is_said_of_workers() -> None:
    ok = WorkerView("gpu2:50052", "7.0.0", ((22 << 30, 24 << 30),))
    assert ok.text() == "gpu2:50052: 1 device: #0 22.0 GiB free of 24.0 GiB (RPC 7.0.0)"
    down = WorkerView("gpu3:50052", problem="cannot connect (Connection refused)")
    assert rpc.workers_problem([ok]) == ""
    assert rpc.workers_problem([ok, down]) == \
        "RPC worker gpu3:50052: cannot connect (Connection refused)"
