"""The gateway's usage for Prometheus, by key name and preset (issue 46, item 2): a second
node_exporter textfile beside the daemon's own (``metrics_textfile``), named after it with
``-usage`` (``lokid.prom`` → ``lokid-usage.prom``).

A file of its own, not more families in :mod:`lokid.watch.promfile`'s: its series are
per key, so a team of a thousand keys makes it large, and it changes at each report of
the gateway (once a second while requests flow), not with the engines' states.

Counters count from the daemon's start, like every lokid counter (a restart is a counter
reset for ``rate()`` and ``increase()``); what is kept across restarts is ``lokictl
usage``'s (:mod:`lokid.store.usage`). Cardinality is bounded: at most
:data:`MAX_PAIRS` (key, preset) pairs have series of their own; the counts of any pair
past that are added to key ``_other`` (a name no key can have: key names start with a
letter or a digit) of the same preset, and the daemon's log says so once. Each pair has
at most 1 + 3 + 2 + (the HTTP status codes 400 to 599 it was refused with) series.

:func:`render` is pure; the file is written by :class:`lokid.watch.promfile.Textfile`
(temp file, fsync, rename, mode 0644; removed at the daemon's stop).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.serve.usage import REFUSED_PREFIX
from .promfile import escape_help, escape_label, format_value

MAX_PAIRS = 1000
OTHER = "_other"
KINDS = (("prompt", "prompt_tokens"), ("cached", "cached_tokens"),
         ("generated", "generated_tokens"))

FAMILIES: tuple[tuple[str, str], ...] = (
    ("lokid_usage_requests_total",
     "Requests the gateway answered for the key and preset since the daemon started, "
     "counted where each request entered (a request served by a peer gateway included)."),
    ("lokid_usage_tokens_total",
     "Tokens of the key's requests to the preset since the daemon started, from the "
     "engine's own figures: kind prompt (all of the prompt, cached included), cached (the "
     "prompt's tokens the engine served from its cache), generated."),
    ("lokid_usage_refused_total",
     "Answers with an HTTP status of 400 or more to the key's requests for the preset "
     "since the daemon started, by status code."),
    ("lokid_usage_wait_seconds_total",
     "Seconds the key's requests for the preset waited in the gateway's queue before they "
     "started, summed, since the daemon started."),
    ("lokid_usage_engine_seconds_total",
     "Seconds the engine spent on the key's requests for the preset (its prompt and "
     "predicted times), summed, since the daemon started."),
)


def usage_path(metrics_textfile: str) -> str:
    """Where the usage file goes for the daemon's ``metrics_textfile``; "" for none."""
    if not metrics_textfile:
        return ""
    stem = metrics_textfile[:-len(".prom")] if metrics_textfile.endswith(".prom") \
        else metrics_textfile
    return stem + "-usage.prom"


def pair_of(counts: Mapping[tuple[str, str], object], key: str, preset: str) -> tuple[str, str]:
    """The series ``key``/``preset`` is counted under: its own, or ``_other``'s once
    :data:`MAX_PAIRS` pairs have series."""
    if (key, preset) in counts or len(counts) < MAX_PAIRS:
        return key, preset
    return OTHER, preset


def render(counts: Mapping[tuple[str, str], Mapping[str, int]]) -> str:
    """The file for ``counts``: (key, preset) → counter → total since the daemon started."""
    lines: dict[str, list[str]] = {name: [] for name, _ in FAMILIES}
    for (key, preset), c in sorted(counts.items()):
        base = f'key="{escape_label(key)}",preset="{escape_label(preset)}"'
        lines["lokid_usage_requests_total"].append(
            f"lokid_usage_requests_total{{{base}}} {int(c.get('requests', 0))}")
        for kind, counter in KINDS:
            lines["lokid_usage_tokens_total"].append(
                f'lokid_usage_tokens_total{{{base},kind="{kind}"}} {int(c.get(counter, 0))}')
        for counter, value in sorted(c.items()):
            if counter.startswith(REFUSED_PREFIX):
                code = counter[len(REFUSED_PREFIX):]
                lines["lokid_usage_refused_total"].append(
                    f'lokid_usage_refused_total{{{base},code="{code}"}} {int(value)}')
        for family, counter in (("lokid_usage_wait_seconds_total", "wait_ms"),
                                ("lokid_usage_engine_seconds_total", "engine_ms")):
            seconds = format_value(int(c.get(counter, 0)) / 1000)
            lines[family].append(f"{family}{{{base}}} {seconds}")
    text = ["# The gateway's usage by key and preset (lokid(8), lokictl usage). Rewritten "
            "by lokid: do not edit."]
    for name, help_text in FAMILIES:
        if lines[name]:
            text += [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} counter",
                     *lines[name]]
    return "\n".join(text) + "\n"
