"""Ask an RPC worker (llama.cpp's ``ggml-rpc-server``) whether it answers, which protocol it
speaks and each device's free and total memory: the HELLO, DEVICE_COUNT and
GET_DEVICE_MEMORY commands of its wire (:mod:`lokid.core.fleet.rpc`), on one short
connection, every step bounded by ``timeout``.

A worker serves one client at a time: a connection it accepted but does not answer is
"busy" (an engine holds it), told apart from one refused or unreachable ("down").
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from ..core.fleet import rpc
from ..core.fleet.rpc import WorkerView

TIMEOUT = 2.0
MAX_DEVICES = 64


def _exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("it closed the connection")
        data += chunk
    return data


def _answer(sock: socket.socket, expected: int) -> bytes:
    (size,) = struct.unpack("<Q", _exact(sock, 8))
    if size != expected:
        raise ValueError(f"it answered {size} bytes where {expected} were due: not a "
                         "ggml-rpc-server of this llama.cpp build")
    return _exact(sock, expected)


def probe(endpoint: str, timeout: float = TIMEOUT) -> WorkerView:
    """What ``endpoint`` (HOST:PORT) says of itself; never raises."""
    host, _, port = endpoint.partition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.gaierror as e:
        return WorkerView(endpoint, problem=f"cannot resolve {host} ({e.strerror})")
    except TimeoutError:
        return WorkerView(endpoint, problem=f"does not answer: no connection in {timeout:g} s")
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return WorkerView(endpoint, problem=f"cannot connect ({why}): is loki-rpc@ running "
                          "there, on that address?")
    with sock:
        try:
            sock.sendall(rpc.hello())
            try:
                major, minor, patch = rpc.read_hello(_answer(sock, rpc.HELLO_ANSWER))
            except TimeoutError:
                return WorkerView(endpoint, busy=True, problem=(
                    f"busy: it took the connection but did not answer in {timeout:g} s (a "
                    "ggml-rpc-server serves one client at a time: another engine holds it)"))
            sock.sendall(rpc.device_count())
            count = min(rpc.read_count(_answer(sock, rpc.COUNT_ANSWER)), MAX_DEVICES)
            devices = []
            for index in range(count):
                sock.sendall(rpc.device_memory(index))
                devices.append(rpc.read_memory(_answer(sock, rpc.MEMORY_ANSWER)))
        except TimeoutError:
            return WorkerView(endpoint, problem=f"stopped answering mid-probe ({timeout:g} s)")
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            return WorkerView(endpoint, problem=why or type(e).__name__)
    return WorkerView(endpoint, f"{major}.{minor}.{patch}", tuple(devices))


def probe_all(endpoints: Sequence[str], timeout: float = TIMEOUT) -> list[WorkerView]:
    """Every worker at once (threads: a probe waits on the network), in order."""
    if not endpoints:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(endpoints), 16)) as pool:
        return list(pool.map(lambda e: probe(e, timeout), endpoints))
