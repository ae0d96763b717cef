"""A preset's benchmark: find its running engine, run the protocol, keep a complete result.

Shared by ``lokid bench <preset>`` (against a preset started with ``lokid
run`` or its unit) and the daemon's ``Bench()``. The preset is planned as its
running start was (``unit.decide``, the attempt verdict applied): the plan
gives the engine's address and what the benchmark reads from the command line
(ubatch, weights on CPU, KV types, GPUs), and the fingerprint the result is
saved under: the plan's configuration, the engine, the GPUs and the protocol
version. A preset whose configuration changed no longer shows an old result.

A partial result is returned and shown but never saved.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import httpx

from . import bench
from . import benchcore as core
from .errors import EngineError
from .gather import gather
from .plan import Plan, PlanInputs
from .state import SavedBench, StateDB
from .supervisor import engine_url
from .unit import decide


@dataclass
class Outcome:
    result: core.Result
    saved: bool
    fingerprint: str
    url: str


def planned(config_dir: str, state_dir: str, name: str) -> tuple[Plan, PlanInputs]:
    """The plan of the preset's running start (blocking: files, the engine's --help)."""
    inputs = gather(config_dir, name)
    with StateDB(state_dir) as db:
        plan, _, _ = decide(inputs, db)
    return plan, inputs


def sampler_here(port: int) -> bench.IOSampler | None:
    """``lokid bench``: the engine's process found by its port in /proc (blocking), or None
    when it cannot be read (another user's, without CAP_SYS_PTRACE)."""
    from .procio import sampler_for_port

    return sampler_for_port(port)


async def measure(config_dir: str, state_dir: str, name: str, opts: bench.Options,
                  progress: bench.Progress | None = None,
                  io_sampler: bench.IOSampler | None = None,
                  plan_and_inputs: tuple[Plan, PlanInputs] | None = None) -> Outcome:
    """Benchmark preset ``name``'s running engine; ``io_sampler`` reads its disk reads
    and memory for the thrash hint (see :func:`sampler_here`)."""
    plan, inputs = plan_and_inputs or planned(config_dir, state_dir, name)
    url = engine_url(plan.host, plan.port)
    facts = core.plan_facts(list(plan.argv), dict(plan.env))
    model = os.path.basename(inputs.model_path)
    wanted = inputs.preset.chat.reasoning_effort or ""
    with StateDB(state_dir) as db:
        learned = db.effort(model, wanted) if wanted else None

    def learn(want: str, used: str) -> None:
        # The chat template refused the preset's level: remembered for this model, so the
        # next benchmark sends what it accepts at once.
        with StateDB(state_dir) as db:
            db.learn_effort(model, want, used)

    setup = bench.Setup(ubatch=facts.ubatch, cpu_placed=facts.cpu_placed,
                        hybrid=inputs.model.hybrid, kv=facts.kv,
                        kv_quantized=facts.kv_quantized, gpus=facts.gpus,
                        effort=wanted if learned is None else learned,
                        sampling=dict(inputs.preset.chat.sampling()), learn=learn,
                        retried=learned is not None)
    async with httpx.AsyncClient() as client:
        try:
            health = (await client.get(url + "/health", timeout=5)).status_code
        except httpx.HTTPError:
            health = 0
        if health != 200:
            raise EngineError(f"preset {name!r} has no ready engine at {url}: start it first "
                              f"(lokictl start {name}, or lokid run {name})")
        result = await bench.run(bench.Engine(url, client), opts, setup, progress=progress,
                                 io_sampler=io_sampler)
    fp = core.plan_fingerprint(plan, inputs)
    saved = False
    if result.savable:
        with StateDB(state_dir) as db:
            db.save_bench(SavedBench(name, result.to_json(), model, result.engine, fp,
                                     time.time()))
        saved = True
    return Outcome(result, saved, fp, url)
