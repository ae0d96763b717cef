"""``lokictl pull`` and ``lokictl pulls``: models fetched to the server (issue 48,
:mod:`lokid.dbus.pulls`).

``lokictl pull REFERENCE [--dir DIR]`` asks the daemon to start the pull (its own unit)
and follows its ``PullProgress`` until it ends: a progress bar on a terminal, a line per
tenth otherwise, one JSON object per report with ``--json`` (for scripts and Ansible).
Leaving (Ctrl-C) leaves the pull running, and says how to find or stop it; ``--no-wait``
returns at once with the unit's name. ``lokictl pull --cancel UNIT`` stops one (what came
is kept for a resume); ``lokictl pulls`` lists them.

Exit status: 0 when the files are in place, 1 when the pull failed or was stopped (its
reason on stderr), and lokictl's usual codes for a refused call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from ..core.names import BUS_NAME, OBJECT_PATH, PULLS_INTERFACE
from .client import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Client, CtlError

FINAL = ("done", "failed", "stopped")
POLL = 5.0    # s without a signal before ListPulls is asked (a daemon restarted meanwhile)


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("pull", help="fetch a model to the server (Hugging Face ORG/REPO:QUANT, "
                       "ORG/REPO/FILE.gguf, or a URL) into model_dirs, resumable and checked")
    s.add_argument("reference", nargs="?", help="ORG/REPO[:QUANT], ORG/REPO@REVISION[:QUANT], "
                   "ORG/REPO/PATH/FILE.gguf or an http(s) URL")
    s.add_argument("--dir", default="", metavar="DIR", help="pull into DIR (default: the "
                   "first of lokid.toml's model_dirs)")
    s.add_argument("--json", action="store_true", help="one JSON object per progress report")
    s.add_argument("--no-wait", action="store_true", help="print the pull's unit and return")
    s.add_argument("--cancel", metavar="UNIT", help="stop the pull running as UNIT (what "
                   "came is kept: the same pull later resumes)")
    s = sub.add_parser("pulls", help="the pulls running, and those ended in the last 10 min")
    s.add_argument("--json", action="store_true")


def size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def line_of(state: str, done: int, total: int, detail: str, rate: float | None) -> str:
    """One line of progress (the bar's text, the non-terminal line)."""
    if state == "fetching":
        share = f"{100 * done // total:3d}% " if total else ""
        of = f" of {size(total)}" if total else ""
        speed = f", {size(int(rate))}/s" if rate else ""
        return f"{share}{size(done)}{of}{speed}"
    return f"{state}: {detail}" if detail else state


class Follower:
    """The reports of one pull, printed as they come."""

    def __init__(self, unit: str, as_json: bool):
        self.unit, self.as_json, self.tty = unit, as_json, sys.stderr.isatty()
        self.last: tuple[str, int, int, str] | None = None
        self.final: tuple[str, str] | None = None
        self.arrived = asyncio.Event()
        self._tenth = -1
        self._rate: float | None = None
        self._seen: tuple[float, int] | None = None

    def report(self, state: str, done: int, total: int, detail: str) -> None:
        if (state, done, total, detail) == self.last:
            return
        self.last = (state, done, total, detail)
        now = time.monotonic()
        if state == "fetching" and self._seen is not None and now > self._seen[0] \
                and done >= self._seen[1]:
            rate = (done - self._seen[1]) / (now - self._seen[0])
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
        self._seen = (now, done)
        if self.as_json:
            print(json.dumps({"unit": self.unit, "state": state, "done": done,
                              "total": total, "detail": detail}), flush=True)
        elif self.tty:
            sys.stderr.write("\r\033[K" + line_of(state, done, total, detail, self._rate))
            if state in FINAL:
                sys.stderr.write("\n")
            sys.stderr.flush()
        else:
            tenth = 10 * done // total if total and state == "fetching" else -1
            if state != "fetching" or tenth != self._tenth:
                self._tenth = tenth
                print(f"  {line_of(state, done, total, detail, None)}", file=sys.stderr,
                      flush=True)
        if state in FINAL:
            self.final = (state, detail)
        self.arrived.set()


async def cmd_pull(c: Client, args: argparse.Namespace) -> int:
    from dbus_fast import Message, MessageType

    if args.cancel:
        await c._call(OBJECT_PATH, PULLS_INTERFACE, "CancelPull", "s", [str(args.cancel)])
        print(f"{args.cancel}: stopping; what came is kept (pull again to resume)",
              file=sys.stderr)
        return EXIT_OK
    if not args.reference:
        raise CtlError("pull: a REFERENCE, or --cancel UNIT", EXIT_USAGE)
    early: list[tuple[str, str, int, int, str]] = []
    follower: Follower | None = None

    def on_message(msg: Message) -> bool:
        if (msg.message_type == MessageType.SIGNAL and msg.member == "PullProgress"
                and msg.path == OBJECT_PATH and msg.interface == PULLS_INTERFACE):
            unit, _, state, done, total, detail = msg.body
            if follower is None:
                early.append((str(unit), str(state), int(done), int(total), str(detail)))
            elif unit == follower.unit:
                follower.report(str(state), int(done), int(total), str(detail))
        return False

    if not args.no_wait:
        await c.add_match(f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',"
                          f"interface='{PULLS_INTERFACE}',member='PullProgress'")
        c.bus.add_message_handler(on_message)
    (unit,) = await c._call(OBJECT_PATH, PULLS_INTERFACE, "Pull", "ss",
                            [str(args.reference), str(args.dir)])
    if args.no_wait:
        print(unit)
        return EXIT_OK
    follower = Follower(str(unit), bool(args.json))
    if not args.json:
        print(f"pulling {args.reference} ({unit})", file=sys.stderr)
    for u, state, done, total, detail in early:
        # a final word before the reply is an earlier pull's of the same unit (a pull again
        # right after a cancel): this one's end comes after its start (or from ListPulls)
        if u == follower.unit and state not in FINAL:
            follower.report(state, done, total, detail)
    try:
        while follower.final is None:
            follower.arrived.clear()
            try:
                await asyncio.wait_for(follower.arrived.wait(), POLL)
            except TimeoutError:
                await _poll(c, follower)
    except asyncio.CancelledError:
        print(f"\nlokictl: the pull goes on in {unit} (lokictl pulls; lokictl pull "
              f"--cancel {unit} stops it)", file=sys.stderr)
        raise
    state, detail = follower.final
    if state == "done":
        if not args.json:
            print(f"done: {detail}", file=sys.stderr)
        return EXIT_OK
    if not args.json:
        print(f"lokictl: pull {state}: {detail}", file=sys.stderr)
    return EXIT_FAILED


async def _poll(c: Client, follower: Follower) -> None:
    """No report for a while: ask the daemon (a restarted daemon's signals were missed)."""
    (pulls,) = await c._call(OBJECT_PATH, PULLS_INTERFACE, "ListPulls")
    for p in pulls:
        row = {k: v.value for k, v in p.items()}
        if row.get("unit") == follower.unit:
            follower.report(str(row["state"]), int(row["done"]), int(row["total"]),
                            str(row["detail"]))
            return


async def cmd_pulls(c: Client, as_json: bool) -> int:
    (pulls,) = await c._call(OBJECT_PATH, PULLS_INTERFACE, "ListPulls")
    rows = [{k: v.value for k, v in p.items()} for p in pulls]
    if as_json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no pull runs or ended in the last 10 minutes")
    for r in rows:
        print(f"{r['unit']}  {r['reference']} → {r['directory']}")
        now = line_of(str(r["state"]), int(r["done"]), int(r["total"]), str(r["detail"]),
                      None)
        print(f"    {now}")
    return EXIT_OK
