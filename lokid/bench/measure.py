"""A preset's benchmark: find its running engine, run the protocol, keep a complete result.

Shared by ``lokid bench <preset>`` (against a preset started with ``lokid
run`` or its unit) and the daemon's ``Bench()``. The preset is planned as its
next start would be (``unit.decide``, the attempt verdict applied): that plan
gives the fingerprint the result is saved under (the plan's configuration,
the engine, the GPUs and the protocol version), so a preset whose
configuration changed no longer shows an old result.

What runs may be older than that plan: the preset edited since its engine
started. The plan of the running start is the runtime plan ``lokid
prestart`` wrote (:mod:`lokid.store.runtimedir`); when it is known, it gives the
engine's address and what the benchmark reads from the command line
(ubatch, weights on CPU, KV types, GPUs), and when its command line or
environment differ from the preset's plan now, the result is shown but not
saved: it measured the old configuration, not the one its fingerprint names.
``lokid run`` writes no runtime plan: then the preset's plan stands for it.

A partial result is returned and shown but never saved either. A result the state DB
cannot store (a full disk, a read-only file system) is returned and shown with why: the
measurement is never lost to its storage (issue 45, item 11).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..core.address import engine_url
from ..core.bench import rules as benchrules
from ..core.bench.iosample import IOSampler
from ..core.config.presetname import check_preset_name
from ..core.errors import EngineError, StalePlanError, StateError
from ..core.launch.plan import Plan, PlanInputs
from ..core.launch.runtimeplan import RuntimePlan
from ..planning.gather import decide, gather
from ..store.runtimedir import read_runtime_plan
from ..store.state import SavedBench, StateDB, StateReader
from . import protocol


@dataclass
class Outcome:
    result: benchrules.Result
    saved: bool
    fingerprint: str
    url: str
    not_saved: str = ""   # why it is not saved (benchrules.not_saved_reason), "" when saved

    def reply(self) -> dict[str, Any]:
        """What ``Bench()`` returns and ``lokid bench --json`` prints."""
        return {"result": self.result.to_json(keep_hint=True), "saved": self.saved,
                "not_saved_reason": self.not_saved, "fingerprint": self.fingerprint,
                "url": self.url}


def started(runtime_dir: str, name: str) -> RuntimePlan | None:
    """The runtime plan of the preset's current or last start, or None (blocking, small).
    ConfigError for a name that is no preset name: ``../x`` would read a file outside
    the runtime directory, whichever caller forgot to plan first."""
    check_preset_name(name)
    try:
        return read_runtime_plan(runtime_dir, name)
    except StalePlanError:
        return None


def started_here(runtime_dir: str, name: str) -> RuntimePlan | None:
    """``lokid bench``: the runtime plan when it is the running engine's (blocking: /proc).

    The runtime directory keeps the plan of a stopped unit, and ``lokid run`` writes
    none: a plan counts when something listens on its port and that process, where it
    can be seen (not another user's), runs the plan's command line.
    """
    from ..host import proc

    found = started(runtime_dir, name)
    if found is None or not proc.listening(found.port):
        return None
    pid = proc.pid_listening_on(found.port)
    argv = proc.cmdline(pid) if pid is not None else None
    return None if argv is not None and argv != list(found.argv) else found


def planned(config_dir: str, state_dir: str, name: str) -> tuple[Plan, PlanInputs]:
    """The plan of the preset's running start (blocking: files, the engine's --help)."""
    inputs = gather(config_dir, name, state_dir=state_dir)   # as its start planned it
    db: StateDB | StateReader
    try:
        db = StateDB(state_dir)
    except StateError:   # nothing to write to (a full disk, no database yet): look only
        db = StateReader(state_dir)
    with db:
        plan, _, _ = decide(inputs, db)
    return plan, inputs


def sampler_here(port: int, socket_path: str = "") -> IOSampler | None:
    """``lokid bench``: the engine's process found by its port in /proc (by its UNIX
    socket where systemd holds the port: the port's listener is systemd then), or None
    when it cannot be read (another user's, without CAP_SYS_PTRACE). Blocking."""
    from ..host.proc import sampler_for_port

    return sampler_for_port(port, socket_path)


async def measure(config_dir: str, state_dir: str, name: str, opts: protocol.Options,
                  progress: protocol.Progress | None = None,
                  io_sampler: IOSampler | None = None,
                  plan_and_inputs: tuple[Plan, PlanInputs] | None = None,
                  running: RuntimePlan | None = None) -> Outcome:
    """Benchmark preset ``name``'s running engine, started as ``running`` says (None: as
    the preset's plan now); ``io_sampler`` reads its disk reads and memory for the thrash
    hint (see :func:`sampler_here`)."""
    plan, inputs = plan_and_inputs or planned(config_dir, state_dir, name)
    if running is not None:
        argv, env, host, port = running.argv, running.env, running.host, running.port
    else:  # lokid run writes no runtime plan: the preset's plan now stands for it
        argv, env, host, port = plan.argv, dict(plan.env), plan.host, plan.port
    changed = benchrules.start_differs(plan.argv, plan.env, argv, env)
    url = engine_url(host, port)
    facts = benchrules.plan_facts(argv, env, inputs.model.block_count)
    model = os.path.basename(inputs.model_path)
    wanted = inputs.preset.chat.reasoning_effort or ""
    learned = None
    if wanted:
        with StateReader(state_dir) as reader:   # never raises: unread, it is learned again
            learned = reader.effort(model, wanted)

    def learn(want: str, used: str) -> None:
        # The chat template refused the preset's level: remembered for this model, so the
        # next benchmark sends what it accepts at once; where the state DB cannot be
        # written, learned again next time (never at the cost of this measurement).
        try:
            with StateDB(state_dir) as db:
                db.learn_effort(model, want, used)
        except StateError:
            pass

    setup = protocol.Setup(ubatch=facts.ubatch, cpu_placed=facts.cpu_placed,
                        hybrid=inputs.model.hybrid, kv=facts.kv,
                        kv_quantized=facts.kv_quantized, gpus=facts.gpus,
                        effort=wanted if learned is None else learned,
                        sampling=dict(inputs.preset.chat.sampling()), learn=learn,
                        retried=learned is not None)
    from ..host.credentials import api_key

    key = api_key(running.secrets if running is not None else plan.secrets, argv)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers) as client:
        try:
            health = (await client.get(url + "/health", timeout=5)).status_code
        except httpx.HTTPError:
            health = 0
        if health != 200:
            raise EngineError(f"preset {name!r} has no ready engine at {url}: start it first "
                              f"(lokictl start {name}, or lokid run {name})")
        result = await protocol.run(protocol.Engine(url, client), opts, setup, progress=progress,
                                 io_sampler=io_sampler)
    fp = benchrules.bench_fingerprint(plan, inputs)
    not_saved = benchrules.not_saved_reason(result, changed)
    if not not_saved:
        try:
            with StateDB(state_dir) as db:
                db.save_bench(SavedBench(name, result.to_json(), model, result.engine, fp,
                                         time.time()))
        except StateError as e:   # a full disk: the figures are still this run's to show
            not_saved = f"it could not be stored: {e}"
    return Outcome(result, not not_saved, fp, url, not_saved)
