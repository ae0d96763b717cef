"""When the gateway starts one more replica of a preset, or stops one (issue 47, item 1):
the rule, pure; :mod:`lokid.gateway.replicas` gathers what it reads and calls the
daemon's ``StartReplicaForLoad`` and ``StopReplica``.

Rules, each for the failure it prevents:

1. **Start only when the wait pays for the load.** One more replica is started when the
   oldest request waiting at the preset's gate (:mod:`lokid.gateway.admission`) has
   waited at least as long as a replica's start takes (the preset's measured load,
   :func:`lokid.gateway.groups.swap_cost`): a shorter wait ends before the new engine
   could take it, and the start only spends memory and the load's I/O. Up to
   ``max_replicas``.
2. **Only into room that is free**: a start that would need the placement to evict
   another preset's engine is not made (``fits`` False): a replica must never cut
   busier work to shorten a queue. Where the room is not known (no placement figures,
   no GPU) the start goes on, as every start did before the placement existed; the
   daemon's own refusal still holds.
2b. **Only where it gets compute of its own** (:func:`shares`): a replica on the GPUs its
   siblings use, or on CPU cores their threads already take, adds memory and no
   throughput; it slows them. Measured on 2 CPUs (``benchmarks/replicas_rising.py``),
   three engines of llama-server's default threads (every physical core each) answered
   212 requests where one answered 2,725. A GPU engine gets its own compute where the
   host has GPUs its siblings do not take (``gpus = "auto"``; a preset that names its
   GPUs puts every replica on them); a CPU engine where its threads (``-t``; the
   engine's default is every physical core) and its siblings' fit in the host's
   physical cores. Unknown (no figures): the start goes on. Other presets' engines are
   not counted: their compute is theirs to share.
3. **One change at a time, then a hold-down** of :func:`hold` seconds (the longer of
   :data:`HOLD_MIN` and the measured load): a start shows its effect only once the new
   engine is ready, so a rule that looked again sooner saw the same queue and started
   a second replica the first would have emptied; a stop just made would be answered
   by a start at the next burst. No decision while an engine of the preset loads or
   stops, for the same reason.
4. **Stop the highest index first, when idle**: a replica the gateway started, whose
   engine has had no request for :func:`idle_after` (a quarter of the preset's own
   ``idle_stop``, else :data:`IDLE_AFTER`; shorter than the idle stop, so the replicas
   go before the preset does), while nothing waits. The highest index first: affinity
   spreads new conversations by hash over the replicas' names, so the survivors are
   always the same ones and their caches stay warm. Never a replica the gateway did
   not start (the preset's ``[serve] replicas``, an operator's ``lokictl replica
   start``): the rule never goes below what was asked of it.

Every step can be said in one line with its figures (:attr:`Step.why`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..wording import counted

HOLD_MIN = 2.0       # s: the shortest hold-down after a start or a stop (rule 3)
IDLE_AFTER = 300.0   # s: a replica idle this long stops, where the preset has no idle_stop
READY = "ready"
NEVER = float("-inf")


@dataclass(frozen=True)
class Engine:
    """One engine of the preset: its index (1: the preset's own), state, requests in
    flight, since when it is idle (``NEVER``: busy), and whether the gateway started it."""

    index: int
    state: str
    in_flight: int = 0
    idle_since: float = NEVER
    ours: bool = False


@dataclass(frozen=True)
class Compute:
    """Where one engine of a preset computes: on ``gpus`` GPUs chosen at its start
    (``gpus = "auto"``), on the GPUs its preset names (``fixed``), else on ``threads``
    CPU threads (0: the engine's default, every physical core); ``host_gpus`` and
    ``cores``: the host's GPUs and physical cores (0: not known)."""

    gpus: int = 0
    fixed: tuple[str, ...] = ()
    threads: int = 0
    host_gpus: int = 0
    cores: int = 0


def shares(c: Compute, running: int) -> str:
    """What one more engine beside ``running`` ones would share with them (rule 2b), in
    words; "" where it gets compute of its own, or where that is not known."""
    engines = counted(running, "running engine")
    if c.fixed:
        return f"the GPUs its preset names ({', '.join(c.fixed)}) with its {engines}"
    if c.gpus:
        if c.host_gpus and (running + 1) * c.gpus > c.host_gpus:
            each = "" if c.gpus == 1 else f" of {c.gpus} GPUs each"
            return (f"a GPU with its {engines}{each}: this host has "
                    f"{counted(c.host_gpus, 'GPU')}")
        return ""
    if c.cores <= 0:
        return ""
    threads = c.threads if c.threads > 0 else c.cores
    if (running + 1) * threads > c.cores:
        how = "its -t" if c.threads > 0 else "the engine's default: every core"
        return (f"the CPU with its {engines} of {counted(threads, 'thread')} each "
                f"({how}): this host has {counted(c.cores, 'core')}")
    return ""


@dataclass(frozen=True)
class Load:
    """What the rule reads of one preset, at ``now`` (monotonic seconds)."""

    engines: Sequence[Engine]
    max_replicas: int
    waiting: int = 0            # requests waiting at its gate
    waited: float = 0.0         # the oldest one's wait so far, seconds
    load: float = 0.0           # a replica's start, seconds (measured, else estimated)
    fits: bool | None = None    # one more fits without evicting (None: not known)
    compute: Compute = Compute()   # where an engine of it computes (rule 2b)
    idle_stop: float = 0.0      # the preset's own idle stop (0: none)
    changed_at: float = NEVER   # the rule's last start or stop for it
    now: float = 0.0


@dataclass(frozen=True)
class Step:
    """``verb``: "start", "stop" (of replica ``index``) or "" (nothing); ``why``: one
    line; ``again``: when the rule can say something else without any change (None);
    ``refused``: why a start the wait asks for is not made, in a word ("room",
    "compute"), for the operator's log."""

    verb: str = ""
    index: int = 0
    why: str = ""
    again: float | None = None
    refused: str = ""


def hold(load: float) -> float:
    """The hold-down after a change (rule 3)."""
    return max(HOLD_MIN, load)


def idle_after(idle_stop: float) -> float:
    """How long a replica the gateway started stays idle before it is stopped (rule 4)."""
    return idle_stop / 4 if idle_stop > 0 else IDLE_AFTER


def decide(s: Load) -> Step:
    """The step for one preset now (see the module docstring)."""
    running = [e for e in s.engines if e.state != "inactive" and e.state != "failed"]
    if any(e.state != READY for e in running):
        return Step(why="an engine of it is starting or stopping")
    until = s.changed_at + hold(s.load)
    if s.now < until:
        return Step(why=f"held down {until - s.now:.1f} s more after its last change",
                    again=until)
    if s.waiting:
        if len(running) >= s.max_replicas:
            return Step(why=f"{s.waiting} wait, but {len(running)} engines run: its "
                        f"max_replicas is {s.max_replicas}")
        if s.waited < s.load:
            return Step(why=f"{s.waiting} wait, the oldest {s.waited:.1f} s, less than a "
                        f"replica's load ({s.load:.1f} s)", again=s.now + s.load - s.waited)
        if s.fits is False:
            return Step(why=f"{s.waiting} wait, the oldest {s.waited:.1f} s, but one more "
                        "replica does not fit without evicting another engine",
                        refused="room")
        shared = shares(s.compute, len(running))
        if shared:
            return Step(why=f"{s.waiting} wait, the oldest {s.waited:.1f} s, but one more "
                        f"replica would share {shared}: no faster answer, only more memory",
                        refused="compute")
        taken = {e.index for e in running}
        index = min(k for k in range(1, s.max_replicas + 1) if k not in taken)
        return Step("start", index, f"{s.waiting} wait, the oldest {s.waited:.1f} s, longer "
                    f"than a replica's load ({s.load:.1f} s): replica {index} started")
    ours = sorted((e for e in running if e.ours and e.index > 1), key=lambda e: -e.index)
    if not ours:
        return Step(why="nothing waits")
    top = ours[0]
    quiet = idle_after(s.idle_stop)
    if top.in_flight or top.idle_since == NEVER:
        return Step(why=f"replica {top.index} is busy")
    if s.now - top.idle_since < quiet:
        return Step(why=f"replica {top.index} idle {s.now - top.idle_since:.1f} s of "
                    f"{quiet:.1f}", again=top.idle_since + quiet)
    return Step("stop", top.index, f"replica {top.index} idle {s.now - top.idle_since:.1f} s "
                f"(at least {quiet:.1f}) and nothing waits: stopped")
