"""How presets are served behind one endpoint: a preset's ``[serve]`` table and
lokid.toml's ``[gateway]`` table, typed and validated.

``[serve]`` says when the daemon starts and stops a preset on its own: on the
gateway's first request for it (``on_demand``), after ``idle_stop`` without a
request in flight (requests, not connections: a client holding a keep-alive
connection open does not keep a GPU busy), one preset of a ``group`` at a time
(a GPU shared by several models), a swap waiting at most ``drain`` for the
running preset's requests. Absent, a preset runs as before: started and stopped
by hand only.

``[gateway]`` says where the one endpoint listens and who may use it. It listens
beyond loopback only with client keys: an open OpenAI endpoint on a network
starts engines (and spends GPU time) for anyone who finds it.

Spans are systemd's (systemd.time(7): ``"15min"``, ``"90s"``, ``"1h 30min"``, a
number alone is seconds), read by :func:`lokid.core.timespec.span_seconds`, and
written back by :func:`span_text` the same way. Every error names the file, the
line, the key and what would be valid, as :class:`~lokid.core.config.tomlread.Checker`
does for every other key. Part of the pure core.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..config import secrets
from ..config.presetname import MAX_REPLICAS, valid_preset_name
from ..config.tomlread import Checker, tname
from ..fleet.peers import Peer, parse_peers
from ..timespec import span_seconds
from .fairshare import DEFAULT_MAX_QUEUE, DEFAULT_MAX_QUEUE_PER_KEY, MAX_QUEUE
from .keys import KEYS_FILE

SERVE_KEYS = ("on_demand", "idle_stop", "group", "drain", "keep", "replicas", "max_replicas")
GATEWAY_KEYS = ("listen", "api_keys_file", "max_body", "default_model", "cors_origins",
                "first_byte_timeout", "stream_idle_timeout", "peers", "allowed_hosts",
                "keys_file", "max_queue", "max_queue_per_key", "wait_comments")

DEFAULT_DRAIN = 120.0
MIN_IDLE_STOP = 1.0            # below a second, every pause between two requests stops it
MAX_DRAIN = 86400.0            # a day: longer, and a swap that waits is a swap that never comes
DEFAULT_MAX_BODY = 64 * 1024 * 1024
# The systemd credential api_keys_file travels as to loki-gateway.service (LoadCredential=,
# written by the generator): the gateway's user never reads the operator's file itself.
KEYS_CREDENTIAL = "gateway-api-keys"
MAX_BODY_RANGE = (1024, 1024 * 1024 * 1024)
# How long the gateway waits for an engine's first byte, and for the next one mid-stream
# (issue 28, item 3). A long answer that is not streamed comes whole at its end, and a
# long prompt on a slow GPU is read before the first token: the bounds are minutes, and
# a hung engine is told apart sooner by its /health (lokid.gateway.silence).
DEFAULT_FIRST_BYTE_TIMEOUT = 600.0
DEFAULT_STREAM_IDLE_TIMEOUT = 300.0
TIMEOUT_RANGE = (1.0, 86400.0)
SPAN_FORMS = 'a systemd time span such as "15min", "90s" or "1h 30min" (a number alone is seconds)'


@dataclass(frozen=True)
class Serve:
    """A preset's ``[serve]`` table; the defaults are a preset served by hand."""

    on_demand: bool = False          # started by the gateway's first request for it
    # seconds without a request in flight before it is stopped; None = never
    idle_stop: float | None = None
    group: str = ""                  # at most one preset of a group runs at a time ("" = none)
    # how long a swap waits for the other preset's requests in flight (seconds)
    drain: float = DEFAULT_DRAIN
    # never stopped to make room for another preset (lokid.core.place.policy)
    keep: bool = False
    # engines a start runs, each its own unit and port (lokid.core.serve.replicas), and how
    # many may run at most (started one at a time by StartReplica: the gateway's rule)
    replicas: int = 1
    max_replicas: int = 1


@dataclass(frozen=True)
class GatewayConfig:
    """lokid.toml's ``[gateway]`` table; the defaults are no gateway at all."""

    listen: tuple[str, ...] = ()     # "host:port" each; empty = the gateway is off
    # bearer keys for clients (one per line); without it, loopback only
    api_keys_file: str = ""
    max_body: int = DEFAULT_MAX_BODY
    default_model: str = ""          # for a request without "model" ("" = 400)
    # the web origins whose pages may call the gateway ("*": any); none by default
    cors_origins: tuple[str, ...] = ()
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT
    stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT
    # other lokid gateways this one routes to (lokid.core.fleet.peers)
    peers: tuple[Peer, ...] = ()
    # names a keyless gateway answers to beyond its own (lokid.gateway.hosts)
    allowed_hosts: tuple[str, ...] = ()
    # the named keys file lokictl keys writes (lokid.core.serve.keys), "" for none
    keys_file: str = KEYS_FILE
    # requests waiting for an engine's slots, per preset and per key and preset
    # (lokid.core.serve.fairshare: past them, 429)
    max_queue: int = DEFAULT_MAX_QUEUE
    max_queue_per_key: int = DEFAULT_MAX_QUEUE_PER_KEY
    # SSE comment lines to a streaming client that waits (lokid.gateway.waitnotes)
    wait_comments: bool = False


# --- spans ------------------------------------------------------------------------


def span_setting(c: Checker, key: str, lo: float, hi: float, valid: str) -> float | None:
    value = c.data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise c.error(key, f"must be {SPAN_FORMS}, not {tname(value)}")
    if isinstance(value, str):
        try:
            seconds = span_seconds(value)
        except ValueError as e:
            raise c.error(key, f"{e}: use {SPAN_FORMS}") from None
    else:
        seconds = float(value)
    if not lo <= seconds <= hi:
        raise c.error(key, f"{value!r} is out of range ({valid})")
    return seconds


_SPAN_UNITS = (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0))


def span_text(seconds: float) -> str:
    """``seconds`` as systemd writes a span: ``15min``, ``1h 30min``, ``3s``, ``500ms``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    parts, left = [], round(seconds)
    for unit, size in _SPAN_UNITS:
        count, left = divmod(left, int(size))
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"


# --- [serve] ----------------------------------------------------------------------


def parse_serve(t: Checker | None) -> Serve:
    """The ``[serve]`` table of a preset (its checker, keys already checked; None when
    the table is absent)."""
    if t is None:
        return Serve()
    on_demand = t.boolean("on_demand", False)
    idle_stop = span_setting(t, "idle_stop", MIN_IDLE_STOP, float("inf"),
                             "at least 1s; remove the key to never stop the preset when idle")
    group = t.string("group", "") or ""
    if group and not valid_preset_name(group):
        raise t.error("group", f"{group!r} is not a group name: 1 to 64 characters from "
                      "A-Z a-z 0-9 _ . -, starting with a letter or a digit (as a preset's "
                      "name), or \"\" for none")
    drain = span_setting(t, "drain", 0.0, MAX_DRAIN, "0s to 1d")
    keep = t.boolean("keep", False)
    replicas = t.integer("replicas", 1, MAX_REPLICAS,
                         f"engines a start runs, 1 to {MAX_REPLICAS}") or 1
    bound = t.integer("max_replicas", 1, MAX_REPLICAS,
                      f"engines at most, {replicas} (replicas) to {MAX_REPLICAS}")
    if bound is not None and bound < replicas:
        raise t.error("max_replicas", f"{bound} is below replicas = {replicas}: at most as "
                      f"many engines as a start runs, {replicas} to {MAX_REPLICAS} (or "
                      "remove it: replicas is then the bound)")
    return Serve(on_demand=on_demand, idle_stop=idle_stop, group=group,
                 drain=DEFAULT_DRAIN if drain is None else drain, keep=keep,
                 replicas=replicas, max_replicas=replicas if bound is None else bound)


def serve_notes(serve: Serve) -> list[str]:
    """What ``lokid plan`` says of a preset's serve settings, one line each (none for the
    defaults: a preset served by hand has nothing to explain)."""
    notes = []
    if serve.on_demand:
        notes.append("on_demand = true: started by the gateway's first request for it")
    if serve.idle_stop is not None:
        span = span_text(serve.idle_stop)
        notes.append(f"idle_stop = {span}: stopped after {span} without a request in flight "
                     "(an open connection without a request does not count)")
    if serve.group:
        notes.append(f"group = {serve.group}: at most one preset of group {serve.group} runs "
                     f"at a time; a swap waits up to {span_text(serve.drain)} (drain) for "
                     "the running one's requests in flight")
    if serve.keep:
        notes.append("keep = true: never stopped to make room for another preset (it may "
                     "still be stopped by hand, by idle_stop, or by its group's swap)")
    return notes


# --- [gateway] --------------------------------------------------------------------


def split_listen(text: str) -> tuple[str, int]:
    """``"127.0.0.1:8000"`` or ``"[::1]:8000"`` as an IP address and a port; ValueError
    saying what is valid otherwise. An address, not a host name: a socket unit's
    ``ListenStream=`` takes no name, and a name can resolve elsewhere tomorrow."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, such as [::1]:8000")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address and a port, such as 127.0.0.1:8000 "
                         "or [::1]:8000") from None
    if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be 1 to 65535, such as 127.0.0.1:8000")
    return host, int(port_text)


def loopback(host: str) -> bool:
    """Whether clients at ``host`` can only be on this machine (127.0.0.0/8, ::1)."""
    return ipaddress.ip_address(host).is_loopback


def parse_gateway(t: Checker | None) -> GatewayConfig:
    """lokid.toml's ``[gateway]`` table (its checker, keys already checked; None when the
    table is absent)."""
    if t is None:
        return GatewayConfig()
    listen = t.string_list("listen")
    hosts = []
    for item in listen:
        try:
            hosts.append(split_listen(item)[0])
        except ValueError as e:
            raise t.error("listen", str(e)) from None
    keys = t.string("api_keys_file", "") or ""
    if keys:
        problem = secrets.source_problem(keys)
        if problem:
            raise t.error("api_keys_file", problem)
    named = t.string("keys_file", KEYS_FILE)
    named = KEYS_FILE if named is None else named
    if named and not named.startswith("/"):
        raise t.error("keys_file", f"{named[:64]!r} is not an absolute path (the named keys "
                      f"file, {KEYS_FILE} by default; \"\" for none)")
    open_to = [item for item, host in zip(listen, hosts, strict=True) if not loopback(host)]
    # named keys are counted when the gateway starts (lokid.gateway.settings.settings_of):
    # the file changes with lokictl keys, this one does not
    if open_to and not keys and not named:
        raise t.error("listen", f"{open_to[0]!r} is beyond loopback and gateway.api_keys_file "
                      "is not set: set api_keys_file (client keys, one per line) or keys_file "
                      "(named keys, lokictl keys add) to listen there, or listen on 127.0.0.1 "
                      "only")
    lo, hi = MAX_BODY_RANGE
    max_body = t.integer("max_body", lo, hi, "bytes, 1024 (1 KiB) to 1073741824 (1 GiB)")
    model = t.string("default_model", "") or ""
    if model and (len(model) > 256 or not model.isprintable() or any(ch.isspace() for ch in model)):
        raise t.error("default_model", f"{model!r} is not a model name (a preset's name or "
                      "alias: up to 256 printable characters, no spaces), or \"\" to refuse "
                      "a request without a model")
    origins = t.string_list("cors_origins")
    for origin in origins:
        problem = origin_problem(origin)
        if problem:
            raise t.error("cors_origins", problem)
    names = t.string_list("allowed_hosts")
    for host in names:
        problem = allowed_host_problem(host)
        if problem:
            raise t.error("allowed_hosts", problem)
    queue = t.integer("max_queue", 1, MAX_QUEUE, f"requests, 1 to {MAX_QUEUE}")
    per_key = t.integer("max_queue_per_key", 1, MAX_QUEUE, f"requests, 1 to {MAX_QUEUE}")
    comments = t.boolean("wait_comments", False)
    lo_t, hi_t = TIMEOUT_RANGE
    first = span_setting(t, "first_byte_timeout", lo_t, hi_t, "1s to 1d")
    idle = span_setting(t, "stream_idle_timeout", lo_t, hi_t, "1s to 1d")
    return GatewayConfig(listen=tuple(item.strip() for item in listen), api_keys_file=keys,
                         max_body=DEFAULT_MAX_BODY if max_body is None else max_body,
                         default_model=model, cors_origins=tuple(origins),
                         first_byte_timeout=DEFAULT_FIRST_BYTE_TIMEOUT if first is None
                         else first,
                         stream_idle_timeout=DEFAULT_STREAM_IDLE_TIMEOUT if idle is None
                         else idle, peers=parse_peers(t), allowed_hosts=tuple(names),
                         keys_file=named,
                         max_queue=DEFAULT_MAX_QUEUE if queue is None else queue,
                         max_queue_per_key=DEFAULT_MAX_QUEUE_PER_KEY if per_key is None
                         else per_key, wait_comments=comments)


def origin_problem(origin: str) -> str:
    """Why ``origin`` is not a web origin as browsers send it in ``Origin:``
    (``scheme://host`` or ``scheme://host:port``, no path), or "" when it is one
    (``"*"``: any page at all)."""
    if origin == "*":
        return ""
    scheme, sep, rest = origin.partition("://")
    host = rest.rsplit(":", 1)[0] if rest.rsplit(":", 1)[-1].isdigit() else rest
    if (not sep or scheme not in ("http", "https") or not host or origin != origin.strip()
            or any(ch in rest for ch in "/?#@ ") or not origin.isprintable()):
        return (f"{origin[:80]!r} is not a web origin: write it as a browser sends it, "
                "such as \"https://chat.example.org\" or \"http://127.0.0.1:3000\" "
                "(scheme, host, port if not the default, no path), or \"*\" for any page")
    return ""


def allowed_host_problem(host: str) -> str:
    """Why ``host`` is not an entry of ``allowed_hosts`` (a name as a client's ``Host``
    gives it, without port; ``.example.org`` for that domain and its subdomains; ``"*"``
    for any), or "" when it is one."""
    if host == "*":
        return ""
    name = host[1:] if host.startswith(".") else host
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(
            label and len(label) <= 63 and label.isascii()
            and all(ch.isalnum() or ch in "-_" for ch in label) for label in labels):
        return (f"{host[:80]!r} is not a host name: write it as clients name the gateway, "
                "without scheme or port, such as \"llm.example.org\", \".example.org\" for "
                "that domain and its subdomains, or \"*\" for any name")
    return ""
