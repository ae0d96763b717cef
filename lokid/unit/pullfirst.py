"""A start whose model is a hub reference not pulled yet pulls it first (issue 48).

``model = "org/repo:Q4_K_M"`` in a preset: ``lokid engine`` (the unit's main process) finds
the model missing (:class:`~lokid.core.errors.ModelNotPulledError`), has it pulled into
the first of ``model_dirs``, then plans and starts as usual. Rules, each for the failure it
prevents:

- **under the engine's unit the daemon pulls it** (``Pull`` over the system bus; the
  unit's user, loki, holds the manage right by group), always: the daemon's pull unit
  has the mirror (the daemon's ``HF_ENDPOINT``) and the token (root's file, as a
  credential), which this unit has not; and a ``model_dirs`` this unit can write (its
  own ``/var/lib/loki/models``) must not make it pull past them. Under the daemon's local
  runner or by hand (no systemd unit), it pulls here, with the same worker and rules;
- **the progress is the unit's STATUS=** ("pulling org/repo:Q4_K_M: 35% …"), which the
  daemon's preset ``Status``, ``lokictl status`` and the gateway's waiting requests read,
  and each report extends the start's timeout (``EXTEND_TIMEOUT_USEC``): a 40 GB pull
  must not be killed by a timeout sized for loading the model;
- **a pull already running for that model** (an operator's ``lokictl pull``) is followed,
  not refused: the start waits for it;
- **a pull that fails fails the start** with the pull's reason (exit 78 through the
  caller: trying again at once cannot help; the next start resumes what was fetched).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from ..core.errors import LokiError, ModelError, ModelNotPulledError
from ..host.notify import Notifier

EXTEND_US = 180 * 1_000_000   # each report keeps the start alive this long
BEAT = 30.0                   # s between two extensions while nothing is reported


def pull_first(error: ModelNotPulledError, notifier: Notifier,
               config_dir: str) -> LokiError | None:
    """Pull ``error.reference`` into ``error.directory``: None once it is there, else why
    not (the caller fails the start with it)."""
    def relay(text: str) -> None:
        notifier.send(f"STATUS=pulling {error.reference}: {text}",
                      f"EXTEND_TIMEOUT_USEC={EXTEND_US}")

    from .supervisor import PARENT_PID

    relay("starting")
    try:
        if "NOTIFY_SOCKET" in os.environ and not os.environ.get(PARENT_PID):
            asyncio.run(_through_daemon(error, relay))   # systemd's engine unit
        else:
            _here(error, relay, config_dir)
    except LokiError as e:
        return e
    return None


def _here(error: ModelNotPulledError, relay: Any, config_dir: str) -> None:
    from ..core.model import pullref
    from . import pullworker

    status = pullworker.Status(reference=error.reference, directory=error.directory)
    reporter = pullworker.Reporter(None, status, relay)
    token = None
    try:
        with open(os.path.join(config_dir, pullworker.TOKEN_CREDENTIAL), encoding="utf-8") as f:
            token = f.read(4096).strip() or None
    except OSError:
        pass
    worker = pullworker.Worker(error.reference, error.directory, reporter,
                               endpoint=pullref.endpoint_from(os.environ.get("HF_ENDPOINT")),
                               token=token, retries=20)
    if worker.run() != 0 or status.state != pullworker.DONE:
        raise ModelError(f"the pull of {error.reference} {status.state}: {status.detail}")


async def _through_daemon(error: ModelNotPulledError, relay: Any) -> None:
    from dbus_fast import BusType, DBusError, Message, MessageType
    from dbus_fast.aio import MessageBus

    from ..core.errors import BUSY
    from ..core.names import BUS_NAME, OBJECT_PATH, PULLS_INTERFACE
    from ..host.buscall import call
    from ..unit.pullworker import FINAL, describe

    try:
        bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot ask lokid to pull {error.reference}: {e}") from None
    reports: list[tuple[str, str, int, int, str]] = []
    arrived = asyncio.Event()

    def on_message(msg: Message) -> bool:
        if (msg.message_type == MessageType.SIGNAL and msg.member == "PullProgress"
                and msg.interface == PULLS_INTERFACE):
            unit, _, state, done, total, detail = msg.body
            reports.append((str(unit), str(state), int(done), int(total), str(detail)))
            arrived.set()
        return False

    try:
        await call(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                   "AddMatch", "s", [f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',"
                                     f"interface='{PULLS_INTERFACE}',member='PullProgress'"])
        bus.add_message_handler(on_message)
        try:
            (unit,) = await call(bus, BUS_NAME, OBJECT_PATH, PULLS_INTERFACE, "Pull", "ss",
                                 [error.reference, error.directory])
        except DBusError as e:
            if e.type != BUSY:
                raise ModelError(f"lokid refused to pull {error.reference}: {e.text}") from None
            unit = await _running(bus, error)   # an operator's pull of it: follow that one
        last = time.monotonic()
        while True:
            arrived.clear()
            for u, state, done, total, detail in reports:
                if u != unit:
                    continue
                from ..unit.pullworker import Status

                relay(describe(Status(reference=error.reference, directory=error.directory,
                                      state=state, done=done, total=total or None,
                                      detail=detail, file=error.reference)))
                last = time.monotonic()
                if state in FINAL:
                    if state == "done":
                        return
                    raise ModelError(f"the pull of {error.reference} {state}: {detail}")
            reports.clear()
            try:
                await asyncio.wait_for(arrived.wait(), BEAT)
            except TimeoutError:
                if time.monotonic() - last >= BEAT:
                    relay("waiting for the pull's next report")
                    await _poll(bus, unit, reports)
    finally:
        bus.disconnect()


async def _running(bus: Any, error: ModelNotPulledError) -> str:
    from ..core.names import BUS_NAME, OBJECT_PATH, PULLS_INTERFACE
    from ..host.buscall import call

    (pulls,) = await call(bus, BUS_NAME, OBJECT_PATH, PULLS_INTERFACE, "ListPulls")
    for p in pulls:
        row = {k: v.value for k, v in p.items()}
        if row.get("reference") == error.reference and row.get("directory") == error.directory:
            return str(row["unit"])
    raise ModelError(f"lokid says {error.reference} is being pulled, but lists no such pull")


async def _poll(bus: Any, unit: str, reports: list[tuple[str, str, int, int, str]]) -> None:
    """A report missed (the daemon restarted): its state from ListPulls."""
    from ..core.names import BUS_NAME, OBJECT_PATH, PULLS_INTERFACE
    from ..host.buscall import call

    (pulls,) = await call(bus, BUS_NAME, OBJECT_PATH, PULLS_INTERFACE, "ListPulls")
    for p in pulls:
        row = {k: v.value for k, v in p.items()}
        if row.get("unit") == unit:
            reports.append((unit, str(row["state"]), int(row["done"]), int(row["total"]),
                            str(row["detail"])))
