"""An RPC worker host's config, ``rpc/<name>.toml`` beside the presets (issue 30, item 2),
typed and validated; the worker's command line and its unit's drop-in. Part of the pure
core.

::

    # /etc/loki/rpc/gpu.toml → loki-rpc@gpu.service
    listen = "10.0.0.2:50052"     # one address and port, never 0.0.0.0 or ::
    heads = ["10.0.0.1"]          # the head hosts allowed to connect (IPAddressAllow=)
    devices = ["CUDA0"]           # optional: ggml-rpc-server -d; default: every GPU
    threads = 8                   # optional: -t, for a CPU device
    cache = true                  # optional: -c, tensors cached under /var/cache/loki

llama.cpp's ``ggml-rpc-server`` has no authentication and warns never to expose it to an
open network. So the rules, each for a failure it prevents:

- ``listen`` is one IP address (the socket is bound to it, not to every interface), and
  ``0.0.0.0``, ``::`` are refused;
- beyond loopback, ``heads`` is required: the unit gets ``IPAddressDeny=any`` and
  ``IPAddressAllow=`` these addresses only, so the kernel drops what comes from
  elsewhere; a head is an IP address or a network in CIDR form, never a name (the
  generator cannot resolve names, and a name resolved once is stale later);
- loopback is admitted only where the head is local (issue 45, item 7): a worker that
  listens on loopback (its head runs on this host; without ``heads`` the fence is
  ``localhost``), or a loopback head written in ``heads``. Loopback was once always
  admitted: any local user's process that bound 127.0.0.1 and connected to the worker's
  LAN address got its hello, and holding that connection made the head see the worker
  "busy" and its engine's start fail. A worker on loopback with only remote heads is
  refused (no head could reach it). The fence filters addresses, not users: where
  loopback is admitted, every local user is (no unit directive can filter the sending
  user; loki-rpc@.service(8) says so);
- the worker runs as ``loki`` with the engines' sandbox, its tensor cache under
  ``/var/cache/loki/rpc`` (``LLAMA_CACHE``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..config.tomlread import Checker, parse_toml, tname

WORKER_KEYS = ("listen", "heads", "devices", "threads", "cache", "server")
DEFAULT_PORT = 50052
CACHE_DIR = "/var/cache/loki/rpc"
RPC_SERVER = "ggml-rpc-server"   # beside llama-server in a build with GGML_RPC=ON


@dataclass(frozen=True)
class Worker:
    name: str
    host: str
    port: int
    heads: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    threads: int | None = None
    cache: bool = False
    server: str = ""       # ggml-rpc-server's path; "" = beside the engine of lokid.toml

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def parse_worker(text: str, path: str, name: str) -> Worker:
    """``rpc/<name>.toml``'s text; ConfigError naming the file, line and key."""
    c = Checker(path, text, parse_toml(text, path))
    c.reject_unknown(WORKER_KEYS)
    listen = c.string("listen")
    if not listen:
        raise c.error("listen", f"missing: the address and port the worker listens on, such "
                      f"as \"10.0.0.2:{DEFAULT_PORT}\" (one address, never 0.0.0.0)")
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise c.error("listen", f"{listen!r}: an IP address and a port, such as "
                      f"\"10.0.0.2:{DEFAULT_PORT}\"") from None
    if not sep or not 1 <= port <= 65535:
        raise c.error("listen", f"{listen!r}: the port must be 1 to 65535")
    if address.is_unspecified:
        raise c.error("listen", f"{listen!r} listens on every address: ggml-rpc-server has "
                      "no authentication, so name the one address the heads reach it on")
    if address.version == 6:
        raise c.error("listen", f"{listen!r}: llama.cpp's --rpc cannot name an IPv6 worker "
                      "(it splits HOST:PORT at the first ':'): use an IPv4 address")
    heads = c.string_list("heads")
    for head in heads:
        try:
            ipaddress.ip_network(head, strict=False)
        except ValueError:
            raise c.error("heads", f"{head!r}: an IP address or a network (10.0.0.0/24), "
                          "not a name: the kernel filters addresses") from None
    if not address.is_loopback and not heads:
        raise c.error("heads", "missing: the head hosts allowed to connect (such as "
                      "[\"10.0.0.1\"]): the worker has no authentication, and beyond "
                      "loopback only they may reach it")
    if address.is_loopback and heads and not any(_loopback(h) for h in heads):
        raise c.error("heads", f"{', '.join(heads)}: no head can reach a worker that "
                      f"listens on {address} (loopback): listen on the address the heads "
                      "reach, or leave heads out for a head on this host")
    devices = c.string_list("devices")
    for device in devices:
        if not device or not device.replace("_", "").isalnum():
            raise c.error("devices", f"{device!r}: a ggml device name such as \"CUDA0\" "
                          "(`llama-server --list-devices` names them)")
    server = c.string("server", "") or ""
    if server and not server.startswith("/"):
        raise c.error("server", f"{server!r}: an absolute path to {RPC_SERVER}")
    value = c.data.get("cache", False)
    if not isinstance(value, bool):
        raise c.error("cache", f"must be true or false, not {tname(value)}")
    return Worker(name, str(address), port, heads, devices,
                  c.integer("threads", 1, 1024, "CPU threads, 1 to 1024"), value, server)


def worker_argv(worker: Worker, server: str) -> list[str]:
    """The worker's command line (``server``: ggml-rpc-server's path)."""
    argv = [server, "--host", worker.host, "--port", str(worker.port)]
    if worker.devices:
        argv += ["--device", ",".join(worker.devices)]
    if worker.threads is not None:
        argv += ["--threads", str(worker.threads)]
    if worker.cache:
        argv.append("--cache")
    return argv


def _loopback(head: str) -> bool:
    return ipaddress.ip_network(head, strict=False).network_address.is_loopback


def worker_fence(worker: Worker) -> tuple[str, ...]:
    """The addresses allowed to connect (``IPAddressAllow=``): the heads, and loopback
    only for a worker on loopback written without heads (its head is on this host)."""
    if worker.heads:
        return worker.heads
    return ("localhost",)


def worker_dropin(worker: Worker) -> str:
    """``loki-rpc@<name>.service``'s drop-in: who may connect, said to the kernel."""
    allow = " ".join(worker_fence(worker))
    return ("# Generated by lokid from rpc/" + worker.name + ".toml; edit that file, then\n"
            "# `systemctl daemon-reload` and restart the unit.\n"
            "[Unit]\n"
            f"Description=llama.cpp RPC worker {worker.name} on {worker.endpoint} (lokid)\n"
            "[Service]\n"
            f"IPAddressAllow={allow}\n")
