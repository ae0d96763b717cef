"""One model across hosts with llama.cpp's RPC backend (issue 30, item 2): the preset key
``rpc``, the wire format of a worker's answers, and what is said of them. Part of the
pure core: the probe itself (a socket) is :mod:`lokid.host.rpcprobe`.

::

    rpc = ["gpu2:50052", "10.0.0.3:50052"]     # → --rpc gpu2:50052,10.0.0.3:50052

Each worker is a ``ggml-rpc-server`` (loki-rpc@<name>.service on its host). Rules, each
for a failure it prevents:

- a worker is ``HOST:PORT`` with HOST a name or an IPv4 address: llama.cpp splits an
  endpoint at its first ``:`` (``parse_endpoint`` in ggml-rpc.cpp), so an IPv6 address
  would reach another host than the one written; one worker once;
- ``rpc`` and an ``extra_args`` ``--rpc`` together are an error (two lists, one flag);
- a worker serves **one client at a time** (its accept loop serves a connection to its
  end): a probe that connects and gets no answer is told apart from one refused, and
  said as "busy" (another engine holds it, or any process its fence admits: a head's
  address, loopback where a head is local, :mod:`lokid.core.fleet.worker`), never as
  down;
- the protocol is checked (HELLO, major version 7 in b11434): a worker of another
  llama.cpp build is refused before the engine aborts on it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.tomlread import Checker, tname

MAX_WORKERS = 16
DEFAULT_PORT = 50052
PROTO_MAJOR = 7            # RPC_PROTO_MAJOR_VERSION of b11434 (ggml/include/ggml-rpc.h)
CONN_CAPS = 24             # RPC_CONN_CAPS_SIZE: the HELLO's capabilities (zero: none)
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT = 11, 14, 15
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*")


def endpoint_problem(text: str) -> str | None:
    """Why ``text`` cannot be a worker for --rpc, or None."""
    host, sep, port = text.partition(":")
    if not sep or not host or ":" in port or not port.isdigit():
        return (f"{text!r}: a worker is HOST:PORT, such as \"gpu2:{DEFAULT_PORT}\" (a name or "
                "an IPv4 address; llama.cpp splits it at the first ':', so no IPv6)")
    if not 1 <= int(port) <= 65535:
        return f"{text!r}: the port must be 1 to 65535"
    if not _NAME.fullmatch(host) or len(host) > 253:
        return f"{text!r}: {host!r} is not a host name or an IPv4 address"
    return None


def parse_rpc(c: Checker, extra_args: Sequence[str]) -> tuple[str, ...]:
    """The preset's ``rpc`` workers, checked (``extra_args`` for a second --rpc)."""
    value = c.data.get("rpc")
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise c.error("rpc", "must be a list of workers such as [\"gpu2:50052\"], not "
                      f"{tname(value) if not isinstance(value, list) else 'an empty list'}")
    if len(value) > MAX_WORKERS:
        raise c.error("rpc", f"{len(value)} workers: at most {MAX_WORKERS}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise c.error("rpc", f"item {i} must be a string, not {tname(item)}")
        problem = endpoint_problem(item)
        if problem:
            raise c.error("rpc", f"item {i}: {problem}")
        if item in out:
            raise c.error("rpc", f"item {i}: {item} is listed twice")
        out.append(item)
    if any(a == "--rpc" or a.startswith("--rpc=") for a in extra_args):
        raise c.error("rpc", "extra_args sets --rpc too: keep only one of them")
    return tuple(out)


def rpc_args(workers: Sequence[str]) -> list[str]:
    return ["--rpc", ",".join(workers)] if workers else []


def workers_of(argv: Sequence[str]) -> tuple[str, ...]:
    """The workers an engine's argv names (``--rpc A,B`` or ``--rpc=A,B``), in order."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        value = None
        if arg == "--rpc" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--rpc="):
            value = arg[len("--rpc="):]
        if value:
            found += [w.strip() for w in value.split(",") if w.strip()]
    return tuple(found)


# --- the wire: | cmd (1 byte) | size (u64 LE) | payload |, answered | size | payload | ---


def request(cmd: int, payload: bytes = b"") -> bytes:
    return bytes([cmd]) + struct.pack("<Q", len(payload)) + payload


def hello() -> bytes:
    return request(CMD_HELLO, bytes(CONN_CAPS))


def device_count() -> bytes:
    return request(CMD_DEVICE_COUNT)


def device_memory(device: int) -> bytes:
    return request(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device))


HELLO_ANSWER = 4 + CONN_CAPS       # major, minor, patch, padding, caps
COUNT_ANSWER = 4                   # u32
MEMORY_ANSWER = 16                 # u64 free, u64 total


def read_hello(payload: bytes) -> tuple[int, int, int]:
    """(major, minor, patch); ValueError for another protocol than this build's."""
    if len(payload) != HELLO_ANSWER:
        raise ValueError(f"its HELLO answer is {len(payload)} bytes, not {HELLO_ANSWER}: not "
                         "a ggml-rpc-server of llama.cpp b11434's protocol")
    major, minor, patch = payload[0], payload[1], payload[2]
    if major != PROTO_MAJOR:
        raise ValueError(f"it speaks RPC protocol {major}.{minor}.{patch}, this engine "
                         f"{PROTO_MAJOR}.x: run the ggml-rpc-server of the same llama.cpp build")
    return major, minor, patch


def read_count(payload: bytes) -> int:
    if len(payload) != COUNT_ANSWER:
        raise ValueError("its device count answer is malformed")
    return int(struct.unpack("<I", payload)[0])


def read_memory(payload: bytes) -> tuple[int, int]:
    if len(payload) != MEMORY_ANSWER:
        raise ValueError("its device memory answer is malformed")
    free, total = struct.unpack("<QQ", payload)
    return int(free), int(total)


# --- what is said of a worker ---------------------------------------------------------


@dataclass(frozen=True)
class WorkerView:
    endpoint: str
    version: str = ""                               # "7.0.0" once it answered HELLO
    devices: tuple[tuple[int, int], ...] = ()       # (free, total) bytes, by index
    problem: str = ""                               # "" when it answered
    busy: bool = False                              # connected, no answer: held

    def text(self) -> str:
        """One line: "gpu2:50052: 1 device: #0 22.1 GiB free of 24.0 GiB (RPC 7.0.0)"."""
        if self.problem:
            return f"{self.endpoint}: {self.problem}"
        shown = ", ".join(f"#{i} {_gib(free)} free of {_gib(total)}"
                          for i, (free, total) in enumerate(self.devices))
        n = len(self.devices)
        return (f"{self.endpoint}: {n} device{'s' if n != 1 else ''}"
                + (f": {shown}" if shown else "") + f" (RPC {self.version})")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def workers_problem(views: Sequence[WorkerView]) -> str:
    """Why an engine with these workers cannot start now ("" when every one answered)."""
    bad = [v for v in views if v.problem]
    if not bad:
        return ""
    return ("RPC worker" + ("s " if len(bad) > 1 else " ")
            + "; ".join(v.text() for v in bad))
