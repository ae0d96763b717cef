"""The daemon's figures for Prometheus, as a node_exporter textfile-collector file.

No HTTP server of our own: Debian's ``prometheus-node-exporter`` reads every
``*.prom`` file in ``/var/lib/prometheus/node-exporter`` (its textfile collector)
and serves them on its ``/metrics`` with the host's other figures. The daemon
writes one such file (``metrics_textfile`` in ``lokid.toml``) in the Prometheus
text exposition format 0.0.4
(https://prometheus.io/docs/instrumenting/exposition_formats/), named by
https://prometheus.io/docs/practices/naming/: prefix ``lokid_``, base units
(seconds, bytes), counters ending in ``_total``, a HELP and a TYPE line for every
family, labels ``preset`` and ``model`` on every engine series (``preset`` alone on
``lokid_preset_broken``: a file that does not parse names no model), and ``replica`` on
those of a preset's replicas past the first (issue 47: each replica is an engine of its
own; the preset's own engine keeps the series it had, so rules and dashboards written
before replicas read it as before, and ``sum by (preset)`` adds its replicas).

:func:`render` is pure: the records of the presets in, the file's text out.
:class:`Textfile` is its I/O edge: when to write, and the write itself (a temp
file in the same directory, fsync, rename, mode 0644: node_exporter never reads a
half-written file, and runs as another user). A write that fails is one log
line, never an error of the daemon; a missing directory (node_exporter not
installed) means no file.

The counters are the figures of the engine's current start (its invocation, as
``lokictl top`` shows them): a new start, or a restart of the daemon, sets them
back to 0, which Prometheus's ``rate()`` and ``increase()`` read as a counter reset.
A preset that never served a request since the daemon started has no counters.

Staleness: node_exporter keeps serving a file as long as it exists. The daemon
rewrites it whenever a figure or a state changes and at least every
:data:`REFRESH` seconds, with ``lokid_textfile_timestamp_seconds`` (the shipped alert
LokidMetricsStale, ``time() - lokid_textfile_timestamp_seconds > 120``, finds a daemon
that stopped writing), and removes it when it stops cleanly: no file, no lokid series.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..runners.runner import FAILED, INACTIVE, LOADING, READY, STOPPING

log = logging.getLogger("lokid.daemon")

# Rewritten at least this often (seconds), changes or not: the timestamp is the heartbeat.
REFRESH = 15.0
MIB = 1 << 20
STATES = (INACTIVE, LOADING, READY, FAILED, STOPPING)
# The offloaded lines of a start, in order (core.requestlog.Load.offloaded).
OFFLOAD_PARTS = ("model", "draft")

# name, type, help: the families in the order they are written (a family without a
# sample is left out).
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("lokid_textfile_timestamp_seconds", "gauge",
     "When lokid last wrote this file (Unix time). It rewrites it at least every 15 s "
     "while it runs and removes it when it stops."),
    ("lokid_preset_broken", "gauge",
     "1 when the preset cannot start as it is (its file does not parse, or its start "
     "cannot be planned: lokictl presets says why), else 0; 0 for a file marked "
     "example = true (the package's example preset), which never starts by design."),
    ("lokid_engine_up", "gauge",
     "1 when the preset's engine is ready (its /health answered), else 0."),
    ("lokid_engine_state", "gauge",
     "The engine's state: 1 for the current one of inactive, loading, ready, failed, "
     "stopping; 0 for the others."),
    ("lokid_auto_spec_blocked", "gauge",
     "1 when automatic speculative decoding is cut for the preset's configuration (the "
     "last verdict; reason says why), else 0."),
    ("lokid_engine_starts_total", "counter",
     "Starts of the preset's engine this daemon has seen since it started (a new "
     "invocation whose output it read)."),
    ("lokid_idle_stops_total", "counter",
     "Times the daemon stopped the preset's engine after its serve.idle_stop without a "
     "request in flight, since the daemon started."),
    ("lokid_cold_starts_total", "counter",
     "Starts of the preset's engine the gateway asked for a request (a cold start), since "
     "the daemon started."),
    ("lokid_cold_start_wait_seconds", "summary",
     "How long the cold starts that became ready waited, from the gateway's ask to the "
     "engine ready (_sum: seconds, _count: starts)."),
    ("lokid_gateway_requests_total", "counter",
     "Requests the gateway answered for the preset, by HTTP status code (499: the client "
     "went away first), since the daemon started (the gateway reports them each second)."),
    ("lokid_group_swaps_total", "counter",
     "Swaps in the GPU group (serve.group): its running preset stopped for another one, "
     "since the daemon started."),
    ("lokid_engine_start_time_seconds", "gauge",
     "When the engine's current (or last) start began (Unix time, its first output line)."),
    ("lokid_engine_load_seconds", "gauge",
     "How long the engine's current start took to load its model (seconds)."),
    ("lokid_requests_total", "counter",
     "Requests the engine completed in its current start."),
    ("lokid_requests_in_flight", "gauge",
     "Requests the engine is processing now."),
    ("lokid_engine_lines_missed_total", "counter",
     "Engine lines of the current start that journald dropped before the daemon read "
     "them (its 'Suppressed N messages' entries): above 0, the request and token counts "
     "are a lower bound."),
    ("lokid_prompt_tokens_total", "counter",
     "Prompt tokens the engine evaluated (prefill) in its current start."),
    ("lokid_generated_tokens_total", "counter",
     "Tokens the engine generated (decode) in its current start."),
    ("lokid_prefill_tokens_per_second", "gauge",
     "Prefill speed over the requests of the last minute (prompt tokens per second of "
     "prompt evaluation); absent without a request in that minute."),
    ("lokid_decode_tokens_per_second", "gauge",
     "Decode speed over the requests of the last minute (generated tokens per second of "
     "generation); absent without a request in that minute."),
    ("lokid_draft_tokens_generated_total", "counter",
     "Draft tokens speculative decoding proposed in the current start, by kind of "
     "speculation (mtp, ngram, draft, or several joined by +)."),
    ("lokid_draft_tokens_accepted_total", "counter",
     "Draft tokens the model accepted in the current start, by kind of speculation."),
    ("lokid_engine_memory_bytes", "gauge",
     "Memory the engine's buffers take, by device (CUDA0, CUDA_Host, CPU_Mapped, ...) and "
     "buffer (model, KV, compute), as its load lines say (printed at -lv 4 only)."),
    ("lokid_engine_offloaded_layers", "gauge",
     "Layers the engine put on the GPU, of the model or of its draft model (part)."),
    ("lokid_engine_layers", "gauge",
     "Layers of the model or of its draft model (part) the engine loaded, on the GPU or not."),
    ("lokid_evictions_total", "counter",
     "Times the gateway's placement stopped the preset's engine to make room (issue 29), by "
     "reason: room (it was idle), cut (its drain ended with requests in flight)."),
    ("lokid_preset_footprint_bytes", "gauge",
     "What a start of the preset needs on each device (issue 29): measured at its last ready "
     "load of this configuration (source nvml, buffers, cgroup or process), else estimated "
     "from the GGUF header (source estimate)."),
    ("lokid_device_memory_bytes", "gauge",
     "Each device's memory (GPU0..., host) by kind: total, free (now), reserved ([placement] "
     "reserve), lokid (held by lokid's running engines), others (held by other processes)."),
    ("lokid_memory_waiting", "gauge",
     "1 while requests for the preset wait for memory (the gateway's placement holds its "
     "start until room is made; lokictl top says why), 0 once none waits."),
    ("lokid_peer_up", "gauge",
     "Whether the gateway reads each peer gateway of [gateway] peers (1), or finds it down "
     "(0: its models are unavailable through this gateway; lokictl top says why)."),
)
FAMILY_NAMES = tuple(name for name, _, _ in FAMILIES)


@dataclass(frozen=True)
class Record:
    """One preset as the daemon sees it now."""

    preset: str
    model: str                     # the preset's model setting as written
    state: str                     # the runner's state (inactive, loading, ready, ...)
    stats: Mapping[str, Any] = field(default_factory=dict)  # Meters.snapshot(): {} = none
    auto_blocked: str = ""         # why automatic speculation is cut, "" when it is not
    starts: int | None = None      # starts seen since the daemon started (None: unknown)
    # stops for idleness since the daemon started (None: the preset has no idle_stop)
    idle_stops: int | None = None
    # the on-demand counters (lokid.dbus.sight's Stats keys: cold_starts, ...)
    sight: Mapping[str, Any] = field(default_factory=dict)
    # its need per device (the Memory property: needs, sources), {} without a plan
    memory: Mapping[str, Any] = field(default_factory=dict)
    # which of the preset's engines (issue 47, lokid.core.serve.replicas): 1 is its own, whose
    # series carry no replica label (as before replicas existed); 2 and up add
    # replica="k" to every series of that engine
    replica: int = 1


DEVICE_KINDS = (("total", "total"), ("free", "free"), ("reserved", "reserve"),
                ("lokid", "lokid"), ("others", "others"))


def escape_label(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote, newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: backslash and newline escaped (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value: integers as integers, floats as Python writes them (Go's
    ParseFloat reads both), infinities and NaN as the format spells them."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _number(value: Any) -> float | None:
    """A figure of the snapshot, or None when absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


class _Samples:
    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {name: [] for name in FAMILY_NAMES}

    def add(self, family: str, labels: Iterable[tuple[str, str]], value: float | None,
            suffix: str = "") -> None:
        """A sample of ``family`` (``suffix``: a summary's ``_sum`` or ``_count``)."""
        if value is None:
            return
        pairs = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
        name = family + suffix
        self.lines[family].append(f"{name}{{{pairs}}} {format_value(value)}"
                                  if pairs else f"{name} {format_value(value)}")


def render(records: Iterable[Record], now: float, broken: Iterable[str] = (),
           swaps: Mapping[str, int] | None = None,
           devices: Iterable[Mapping[str, Any]] = (), waits: Iterable[str] = (),
           peers: Mapping[str, str] | None = None) -> str:
    """The textfile for ``records`` (one per preset) written at ``now`` (Unix time);
    ``broken``: the presets that cannot start (the Manager's BrokenPresets), each with
    its ``lokid_preset_broken`` 1 whether it has a record or not (a file that does not
    parse has none); ``swaps``: the GPU groups' swaps, by group; ``devices``: the
    Manager's Devices rows; ``waits``: the presets whose requests wait for memory now
    (the Manager's Waits); ``peers``: the gateway's peers, "" for one up (its Peers)."""
    out = _Samples()
    out.add("lokid_textfile_timestamp_seconds", (), round(now, 3))
    records = sorted(records, key=lambda r: (r.preset, r.replica))
    down = set(broken)
    for name in sorted(down | {r.preset for r in records}):
        out.add("lokid_preset_broken", (("preset", name),), 1 if name in down else 0)
    for r in records:
        _preset(out, r)
    waiting = set(waits)
    for r in (r for r in records if r.replica == 1):
        out.add("lokid_memory_waiting", (("preset", r.preset), ("model", r.model)),
                1 if r.preset in waiting else 0)
    for peer, why in sorted((peers or {}).items()):
        out.add("lokid_peer_up", (("peer", peer),), 0 if why else 1)
    for group, count in sorted((swaps or {}).items()):
        out.add("lokid_group_swaps_total", (("group", group),), count)
    for d in devices:
        for kind, key in DEVICE_KINDS:
            out.add("lokid_device_memory_bytes", (("device", str(d.get("device", ""))),
                                                  ("kind", kind)), _number(d.get(key)))
    text = ["# lokid's engines (lokid.toml metrics_textfile; see lokid(8)). "
            "Rewritten by the daemon: do not edit."]
    for name, kind, help_text in FAMILIES:
        lines = out.lines[name]
        if lines:
            text += [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(text) + "\n"


def _preset(out: _Samples, r: Record) -> None:
    base: tuple[tuple[str, str], ...] = (("preset", r.preset), ("model", r.model))
    if r.replica > 1:
        base += (("replica", str(r.replica)),)
    sources = r.memory.get("sources") or {}
    for device, nbytes in sorted((r.memory.get("needs") or {}).items()):
        out.add("lokid_preset_footprint_bytes", (*base, ("device", str(device)),
                                                 ("source", str(sources.get(device, "")))),
                _number(nbytes))
    out.add("lokid_engine_up", base, 1 if r.state == READY else 0)
    for state in (*STATES, *(() if r.state in STATES else (r.state,))):
        out.add("lokid_engine_state", (*base, ("state", state)), 1 if state == r.state else 0)
    out.add("lokid_auto_spec_blocked", (*base, ("reason", r.auto_blocked)),
            1 if r.auto_blocked else 0)
    out.add("lokid_engine_starts_total", base, r.starts)
    out.add("lokid_idle_stops_total", base, r.idle_stops)
    _sight(out, base, r.sight)
    s = r.stats
    if not s:
        return
    out.add("lokid_engine_start_time_seconds", base, _number(s.get("started")))
    out.add("lokid_engine_load_seconds", base, _number(s.get("load_seconds")))
    out.add("lokid_requests_total", base, _number(s.get("requests")))
    out.add("lokid_requests_in_flight", base, _number(s.get("in_flight")))
    out.add("lokid_engine_lines_missed_total", base, _number(s.get("missed_lines", 0)))
    out.add("lokid_prompt_tokens_total", base, _number(s.get("prompt_tokens")))
    out.add("lokid_generated_tokens_total", base, _number(s.get("generated_tokens")))
    for family, key in (("lokid_prefill_tokens_per_second", "prefill_tps"),
                        ("lokid_decode_tokens_per_second", "decode_tps")):
        speeds = s.get(key)
        if isinstance(speeds, Mapping):
            out.add(family, base, _number(speeds.get("1m")))
    draft = s.get("draft")
    if isinstance(draft, Mapping):
        kind = (*base, ("kind", str(draft.get("kind") or "unknown")))
        out.add("lokid_draft_tokens_generated_total", kind, _number(draft.get("generated")))
        out.add("lokid_draft_tokens_accepted_total", kind, _number(draft.get("accepted")))
    memory = s.get("memory_mib")
    if isinstance(memory, Mapping):
        for key, mib in sorted(memory.items()):
            device, _, buffer = str(key).rpartition(" ")
            size = _number(mib)
            if device and size is not None:
                out.add("lokid_engine_memory_bytes",
                        (*base, ("device", device), ("buffer", buffer)), round(size * MIB))
    offload = s.get("offload")
    if isinstance(offload, list):
        for part, figure in zip(OFFLOAD_PARTS, offload, strict=False):  # a third: none
            on_gpu, _, layers = str(figure).partition("/")
            if on_gpu.isdigit() and layers.isdigit():
                out.add("lokid_engine_offloaded_layers", (*base, ("part", part)), int(on_gpu))
                out.add("lokid_engine_layers", (*base, ("part", part)), int(layers))


def _sight(out: _Samples, base: tuple[tuple[str, str], ...], s: Mapping[str, Any]) -> None:
    """The on-demand counters: cold starts, their wait, the gateway's requests."""
    out.add("lokid_cold_starts_total", base, _number(s.get("cold_starts")))
    if _number(s.get("cold_start_waits")) is not None:
        out.add("lokid_cold_start_wait_seconds", base,
                _number(s.get("cold_start_wait_seconds")), "_sum")
        out.add("lokid_cold_start_wait_seconds", base, _number(s.get("cold_start_waits")),
                "_count")
    codes = s.get("gateway_requests")
    if isinstance(codes, Mapping):
        for code, count in sorted(codes.items()):
            out.add("lokid_gateway_requests_total", (*base, ("code", str(code))),
                    _number(count))
    evictions = s.get("evictions")
    if isinstance(evictions, Mapping):
        for reason, count in sorted(evictions.items()):
            out.add("lokid_evictions_total", (*base, ("reason", str(reason))), _number(count))


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text``: a temp file beside it (a name node_exporter does
    not read: it ends in .tmp), fsync, mode 0644 (node_exporter runs as its own user;
    the daemon's umask would hide it), rename. Raises OSError; leaves no temp file."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def where(path: str) -> str:
    """One line for the daemon's log: where its metrics go (blocking: a stat)."""
    if not path:
        return "Prometheus metrics: no textfile (metrics_textfile = \"\" in lokid.toml)"
    directory = os.path.dirname(path)
    if os.path.isdir(directory):
        return f"Prometheus metrics: writing {path} (node_exporter's textfile collector)"
    return (f"Prometheus metrics: {directory} does not exist (prometheus-node-exporter not "
            f"installed?): none written; they would go to {path}")


class Textfile:
    """The daemon's one metrics file: when it is due, and its writes.

    :meth:`write` and :meth:`close` are blocking (run them in a thread) and
    serialised: a write that ends after :meth:`close` writes nothing, so a daemon that
    stops, or moves its file, leaves no stale file behind.
    """

    def __init__(self, path: str, refresh: float = REFRESH):
        self.path = path
        self.refresh = refresh
        self.last_key: object = None
        self.last_write = -math.inf       # time.monotonic() of the last write
        self.invocations: dict[str, str] = {}   # preset → the last start seen
        self.start_counts: dict[str, int] = {}
        self.failure = ""                 # the error last logged, "" while writes succeed
        self.written = False
        self.render_failed = False        # a defect (not an OSError) was logged
        self._lock = threading.Lock()
        self._closed = False

    def due(self, changed: bool, key: object, now: float) -> bool:
        """Whether to write now: figures ``changed``, the presets' states (``key``)
        moved, or :attr:`refresh` seconds passed since the last write."""
        if changed or key != self.last_key or now - self.last_write >= self.refresh:
            self.last_key = key
            self.last_write = now
            return True
        return False

    def starts(self, preset: str, invocation: str | None) -> int | None:
        """Starts of ``preset`` seen so far, counting ``invocation`` (None before any)."""
        if invocation and self.invocations.get(preset) != invocation:
            self.invocations[preset] = invocation
            self.start_counts[preset] = self.start_counts.get(preset, 0) + 1
        return self.start_counts.get(preset)

    def write(self, text: str) -> bool:
        """Write the file (when its directory exists); a failure is logged once, until a
        write succeeds again. Whether it was written."""
        with self._lock:
            if self._closed or not os.path.isdir(os.path.dirname(self.path)):
                return False
            try:
                write_atomic(self.path, text)
            except OSError as e:
                message = f"{type(e).__name__}: {e.strerror or e}"
                if message != self.failure:
                    log.warning("Prometheus metrics: cannot write %s (%s); the daemon goes on "
                                "without", self.path, message)
                    self.failure = message
                return False
            if self.failure:
                log.info("Prometheus metrics: %s written again", self.path)
                self.failure = ""
            self.written = True
            return True

    def close(self) -> None:
        """No more writes; the file, if this daemon wrote it, removed."""
        with self._lock:
            self._closed = True
            if not self.written:
                return
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("Prometheus metrics: cannot remove %s (%s): node_exporter keeps "
                            "serving its last figures", self.path, e.strerror or e)
