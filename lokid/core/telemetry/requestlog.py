"""llama-server's per-request and load lines → records (pure): what telemetry counts.

Formats are llama.cpp b11434's (``tools/server/server-context.cpp`` ``print_timing``
and ``release``; ``src/llama-model.cpp``, ``llama-context.cpp``, ``llama-kv-cache.cpp``
for buffer sizes), with or without the ``0.00.043.866 I `` prefix: every pattern is
searched inside the line, never anchored at its start.

Per request, for one slot and task (two slots interleave their lines)::

    slot launch_slot_: id  3 | task 0 | processing task, is_child = 0
    slot print_timing: id  3 | task 0 | prompt eval time =      27.72 ms /    59 tokens (…)
    slot print_timing: id  3 | task 0 |        eval time =      65.93 ms /    64 tokens (…)
    slot print_timing: id  3 | task 0 |       total time =      93.65 ms /   123 tokens
    slot print_timing: id  3 | task 0 |    graphs reused =         15
    slot print_timing: id  3 | task 0 | draft acceptance = 1.00000 (   47 accepted /  …
        …  47 generated), mean len =  3.94      (one line)
    slot print_timing: id  3 | task 0 |      acc per pos = (1.000, 1.000, 0.938)
    slot      release: id  3 | task 0 | stop processing: n_tokens = 122, truncated = 0
    srv  update_slots: all slots are idle            (no request left in flight)

The draft lines appear only when drafting ran (``acc per pos`` only at ``-lv 4``).
A request that computes no tokens to answer (``/v1/embeddings``, ``/v1/rerank``: an engine
started with ``--embeddings`` or ``--reranking`` serves them beside completions) prints its
launch and release lines and no ``print_timing`` line at all: it is counted in
:attr:`EngineLog.untimed`, so that the breakage warning (:mod:`lokid.watch.meter`) does
not take three embeddings for a log format lokid cannot read (issue 48, item 4). A
timing line lokid cannot parse still marks its request as timed.
Lines are assembled per (slot, task), never by their order: the journal may interleave
two slots, and a reader may see a line late, twice or cut short. The rules that keep one
bad line from spoiling anything else:

- a figure is taken only from a line that matched whole up to and past that figure
  (``… ms /    59 tokens``: the ``tokens`` after it proves the number is complete), so a
  truncated line adds nothing rather than a wrong number; ``mean len`` (the last field)
  must show its two decimals, as ``%5.2f`` prints it;
- a request is returned only when it has both its ``prompt eval time`` and its
  ``eval time`` figures: a release line without them ends that assembly and yields
  nothing (a duplicate release, or one whose timing lines were lost); a timing line
  seen after its release starts a new assembly, which yields a request only if it
  too gets both figures;
- at most :data:`MAX_PENDING` assemblies are held; beyond, the oldest is dropped
  (lines of tasks that never release would otherwise grow without bound);
- a line longer than :data:`MAX_LINE` characters is not one of these lines (they are
  ~150): it is skipped without being searched; the load keeps at most
  :data:`MAX_LOAD_ENTRIES` buffer keys and offloaded lines (an engine prints a few).

A gap (lines of this start that lokid never read: journald said it suppressed some, issue
45, item 9) makes the requests in flight unknown, never "none": a lost launch line hides a
request that runs, a lost release line keeps one that ended. :meth:`EngineLog.gap` marks
every slot unknown; a slot is known again at its next launch or release line (a slot runs
one task at a time), and the count is known again when every slot of the engine (its
``initializing, n_slots = N`` line at load) has been seen so. Without that line the count
stays unknown for the rest of the start: the idle stop waits rather than stop a busy engine.

At load (``-lv 4`` only): ``CUDA0 model buffer size =   920.22 MiB`` (kinds model, KV,
RS, output, compute; devices ``CUDA0``…, ``CUDA_Host``, ``CPU_Mapped``, ``CPU``,
``Vulkan0``…, ``Vulkan_Host``) and ``offloaded N/M layers to GPU``. A draft model (or
an MTP context) loads within the same start and prints the same lines: its buffers
add to the same (device, kind) sums, and its ``offloaded`` line follows the model's.
Compute buffers are the one exception to plain sums: a context may reserve its
scheduler again (the MTP context does, after ``adding speculative implementation
'draft-mtp'``), and each ``compute buffer size`` line gives that scheduler's whole
size (``ggml_backend_sched_get_buffer_size``), not an addition. So compute is summed
over contexts (each begins at ``constructing llama_context``), taking each context's
latest reservation (each begins at ``sched_reserve: reserving ...``): on the recorded
H200 partial-offload log that is CUDA0 243.02 MiB, where a plain sum would say 294.04.

A GPU backend that failed to start (``ggml_cuda_init: failed to initialize CUDA: …``,
printed before the load) is kept as the load's ``gpu_failed``: with the buffers and the
offload lines, it is what :func:`lokid.core.telemetry.enginelog.on_cpu_reason` (the one home of
that rule) judges for the Stats' ``on_cpu`` (issue 44, item 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .enginelog import gpu_failure, host_buffer, on_cpu_reason

# Assemblies (slot, task) held at once: llama-server runs a few slots, each one task at a
# time; only lines of tasks that never release (lost lines, garbage) can exceed this.
MAX_PENDING = 256
# Request and load lines are ~150 characters; anything much longer is not one of them.
MAX_LINE = 4096
# Contexts whose compute buffers are tracked apart: an engine makes 1-3 (model, draft or
# MTP); beyond this, later ones count with the last.
MAX_CONTEXTS = 32
# Load entries kept: (device, kind) buffers (a few per device) and offloaded lines (the
# model's and a draft's); more can only come from garbage lines, and are ignored.
MAX_LOAD_ENTRIES = 64

# The figures: each pattern ends past its last number, so a cut line cannot yield a
# shortened number (see the module docstring); numbers have bounded digits, so a garbage
# line cannot make a giant int (or reach int()'s 4300-digit limit).
_N = r"(\d{1,12})"
_MS = r"(\d{1,12}(?:\.\d{1,6})?)"
_TIMING = re.compile(r"print_timing: id +(\d{1,9}) \| task +(\d{1,12}) \| +")
_PROMPT = re.compile(rf"prompt eval time = +{_MS} ms / +{_N} tokens")
_EVAL = re.compile(rf"eval time = +{_MS} ms / +{_N} tokens")
_TOTAL = re.compile(rf"total time = +{_MS} ms / +{_N} tokens")
_GRAPHS = re.compile(rf"graphs reused = +{_N}")
_DRAFT = re.compile(rf"draft acceptance = \S+ \( *{_N} accepted / +{_N} generated\)"
                    r"(?:, mean len = +(\d{1,9}\.\d\d)\b)?")
_ACC_POS = re.compile(r"acc per pos = \(([0-9., ]{0,400})\)")
# One value of that list: the engine prints each as %.3f, a rate in [0, 1].
_RATE = re.compile(r" *(\d(?:\.\d{1,6})?) *")
_RELEASE = re.compile(rf"release: id +(\d{{1,9}}) \| task +(\d{{1,12}}) \| stop processing: "
                      rf"n_tokens = {_N}, truncated = ([01])\b")
_LAUNCH = re.compile(r"launch_slot_: id +(\d{1,9}) \| task +(\d{1,12}) \| processing task")
_BUFFER = re.compile(rf"(\S+) +(\w+) buffer size = +{_MS} MiB")
_OFFLOADED = re.compile(r"offloaded (\d{1,9})/(\d{1,9}) layers to GPU")
# "srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512, …" (older builds:
# "initializing slots, n_slots = 4"): how many slots a gap leaves unknown.
_SLOTS = re.compile(r"initializing(?: slots)?, n_slots = (\d{1,6})\b")


@dataclass(frozen=True)
class Request:
    """One finished request of one slot: what its print_timing and release lines said.

    ``at`` is the time (seconds since the epoch) of the line that completed it, as the
    caller gave it to :meth:`EngineLog.feed` (for a request returned by
    :meth:`EngineLog.flush`: the time of its last timing line). Draft fields are None
    when the engine printed no draft line (no speculation); ``acc_per_pos`` is empty
    without an ``acc per pos`` line (printed at ``-lv 4`` only)."""

    slot: int
    task: int
    prompt_tokens: int
    prompt_ms: float
    gen_tokens: int
    gen_ms: float
    at: float
    draft_accepted: int | None = None
    draft_generated: int | None = None
    mean_len: float | None = None
    n_tokens: int | None = None       # the slot's context after the request (release line)
    truncated: bool = False
    acc_per_pos: tuple[float, ...] = ()   # draft acceptance by draft position


@dataclass
class Load:
    """What the engine said about its load: memory per (device, kind) in MiB, summed over
    its lines (rounded to the lines' 2 decimals); offloaded (N, M) in order (the model's,
    then a draft's); when the load began (the first ``loading model '…'``) and ended (the
    first ``model loaded``), as the caller's times."""

    buffers: dict[tuple[str, str], float] = field(default_factory=dict)
    offloaded: list[tuple[int, int]] = field(default_factory=list)
    loading_at: float | None = None
    loaded_at: float | None = None
    gpu_failed: str = ""   # what a GPU backend that did not start said (the first one)

    def on_cpu(self) -> str:
        """Why this load runs on the CPU although it has a GPU backend or says it
        offloaded, or "" (:func:`lokid.core.telemetry.enginelog.on_cpu_reason`)."""
        devices = {device for device, _kind in self.buffers}
        some = next(((n, m) for n, m in self.offloaded if n > 0), (0, 0))
        return on_cpu_reason(self.gpu_failed, some, any(map(host_buffer, devices)),
                             not all(map(host_buffer, devices)))

    @property
    def seconds(self) -> float | None:
        if self.loading_at is None or self.loaded_at is None:
            return None
        return max(0.0, self.loaded_at - self.loading_at)


class _Pending:
    """The figures of one (slot, task) so far."""

    __slots__ = ("prompt", "gen", "accepted", "generated", "mean_len", "acc_per_pos",
                 "last_at")

    def __init__(self, at: float) -> None:
        self.prompt: tuple[int, float] | None = None    # (tokens, ms)
        self.gen: tuple[int, float] | None = None
        self.accepted: int | None = None
        self.generated: int | None = None
        self.mean_len: float | None = None
        self.acc_per_pos: tuple[float, ...] = ()
        self.last_at = at

    def request(self, slot: int, task: int, at: float, n_tokens: int | None = None,
                truncated: bool = False) -> Request | None:
        if self.prompt is None or self.gen is None:
            return None
        return Request(slot, task, self.prompt[0], self.prompt[1], self.gen[0], self.gen[1],
                       at, self.accepted, self.generated, self.mean_len, n_tokens,
                       truncated, self.acc_per_pos)


class EngineLog:
    """The lines of one engine start (one invocation), fed in order: the requests it
    finished, its load, and the requests in flight (launched, not yet released)."""

    def __init__(self) -> None:
        self.load = Load()
        self.in_flight: set[tuple[int, int]] = set()   # (slot, task)
        self.known_lines = 0       # lines this parser recognised (for the breakage warning)
        # requests released without one timing line (embeddings, rerank: see the docstring)
        self.untimed = 0
        self._timed: set[tuple[int, int]] = set()   # (slot, task) that printed timing lines
        self._pending: dict[tuple[int, int], _Pending] = {}   # insertion order: oldest first
        self._compute: list[dict[str, float]] = []   # per context: device → MiB, latest
        self.n_slots: int | None = None   # from the load's "n_slots = N" line
        # slots not seen since a gap (None: no gap open); see the module docstring
        self._unsure: set[int] | None = None
        self._unsure_all = False          # a gap with n_slots unknown: unknown until the end

    def gap(self) -> None:
        """Lines of this start were lost: the requests in flight are unknown until every
        slot has been seen again (:attr:`in_flight_known`)."""
        if self.n_slots is None:
            self._unsure_all = True
            self._unsure = set()
        else:
            self._unsure = set(range(self.n_slots))

    @property
    def in_flight_known(self) -> bool:
        """False from a gap until every slot has said what it does again."""
        return not self._unsure_all and not self._unsure

    def _seen(self, slot: int) -> None:
        if self._unsure:
            self._unsure.discard(slot)

    def feed(self, line: str, at: float) -> Request | None:
        """One log line; the request it completes, if any."""
        if len(line) > MAX_LINE:
            return None
        # Cheap rejection first: most lines are none of these (start-up, slot chatter).
        if "| task " in line:
            if "print_timing" in line:
                self._timing(line, at)
            elif "release" in line:
                return self._release(line, at)
            elif "processing task" in line:
                self._launch(line)
        elif "all slots are idle" in line:
            # the server's own word that nothing runs: a request whose release line was
            # lost is not in flight for ever (the idle stop would never come); nor after a gap
            self.in_flight.clear()
            self._unsure, self._unsure_all = None, False
        elif "buffer size" in line:
            m = _BUFFER.search(line)
            if m:
                if m[2] == "compute":
                    self._reserved(m[1], float(m[3]))
                else:
                    key, buffers = (m[1], m[2]), self.load.buffers
                    if key in buffers or len(buffers) < MAX_LOAD_ENTRIES:
                        buffers[key] = round(buffers.get(key, 0.0) + float(m[3]), 2)
                self.known_lines += 1
        elif "layers to GPU" in line:
            m = _OFFLOADED.search(line)
            if m:
                if len(self.load.offloaded) < MAX_LOAD_ENTRIES:
                    self.load.offloaded.append((int(m[1]), int(m[2])))
                self.known_lines += 1
        elif "n_slots = " in line:
            m = _SLOTS.search(line)
            if m and self.n_slots is None:   # not counted in known_lines: the
                self.n_slots = int(m[1])      # breakage warning keeps its contract
        elif "loading model '" in line:
            # the server's own line; not "loading model tensors" nor "loading draft model"
            if self.load.loading_at is None:
                self.load.loading_at = at
            self.known_lines += 1
        elif "model loaded" in line and line.rstrip().endswith(": model loaded"):
            if self.load.loaded_at is None:
                self.load.loaded_at = at
            self.known_lines += 1
        elif ("ggml_" in line and "failed to initialize" in line) or "ggml_vulkan: " in line:
            failed = gpu_failure(line)
            if failed:
                self.load.gpu_failed = self.load.gpu_failed or failed
                self.known_lines += 1
        elif "constructing llama_context" in line:
            if len(self._compute) < MAX_CONTEXTS:
                self._compute.append({})
            self.known_lines += 1
        elif "sched_reserve: reserving" in line:
            if self._compute:
                self._compute[-1].clear()   # a new reservation replaces the context's last
                self._sum_compute()
            self.known_lines += 1
        return None

    @property
    def pending(self) -> int:
        """Assemblies held (requests with some timing lines and no release yet)."""
        return len(self._pending)

    def flush(self, at: float) -> list[Request]:
        """The requests with timings but no release line yet (the engine stopped at
        ``at``), oldest first; each one's ``at`` is its last timing line's (never after
        ``at``). Assemblies without both figures are dropped; nothing is in flight after."""
        out = []
        for (slot, task), p in self._pending.items():
            r = p.request(slot, task, min(p.last_at, at))
            if r is not None:
                out.append(r)
        self._pending.clear()
        self._timed.clear()
        self.in_flight.clear()
        self._unsure, self._unsure_all = None, False   # the engine stopped: nothing runs
        return out

    def _assembly(self, key: tuple[int, int], at: float) -> _Pending:
        p = self._pending.get(key)
        if p is None:
            if len(self._pending) >= MAX_PENDING:
                del self._pending[next(iter(self._pending))]
            p = self._pending[key] = _Pending(at)
        else:
            p.last_at = at
        return p

    def _reserved(self, device: str, mib: float) -> None:
        """One compute buffer line of the current context's latest reservation."""
        if not self._compute:
            self._compute.append({})
        context = self._compute[-1]
        if device in context or len(context) < MAX_LOAD_ENTRIES:
            context[device] = mib
            self._sum_compute()

    def _sum_compute(self) -> None:
        buffers = self.load.buffers
        for key in [k for k in buffers if k[1] == "compute"]:
            del buffers[key]
        for context in self._compute:
            for dev, size in context.items():
                buffers[(dev, "compute")] = round(buffers.get((dev, "compute"), 0.0) + size, 2)

    def _timing(self, line: str, at: float) -> None:
        head = _TIMING.search(line)
        if head is None:
            return
        key = (int(head[1]), int(head[2]))
        if len(self._timed) >= MAX_PENDING:
            self._timed.pop()
        self._timed.add(key)
        rest = line[head.end():]
        if rest.startswith("prompt eval time"):
            m = _PROMPT.match(rest)
            if m:
                self._assembly(key, at).prompt = (int(m[2]), float(m[1]))
        elif rest.startswith("eval time"):
            m = _EVAL.match(rest)
            if m:
                self._assembly(key, at).gen = (int(m[2]), float(m[1]))
        elif rest.startswith("draft acceptance"):
            m = _DRAFT.match(rest)
            if m:
                p = self._assembly(key, at)
                p.accepted, p.generated = int(m[1]), int(m[2])
                p.mean_len = float(m[3]) if m[3] else None
        elif rest.startswith("acc per pos"):
            m = _ACC_POS.match(rest)
            if m:
                parts = [_RATE.fullmatch(v) for v in m[1].split(",")]
                if not all(parts):
                    return   # "(1.0.0, )", "(9999…)": not the engine's list of %.3f
                values = tuple(float(v[1]) for v in parts if v)
                if max(values) > 1.0:
                    return
                self._assembly(key, at).acc_per_pos = values
        else:
            m = _TOTAL.match(rest) or _GRAPHS.match(rest)
        if m:
            self.known_lines += 1

    def _release(self, line: str, at: float) -> Request | None:
        m = _RELEASE.search(line)
        if m is None:
            return None
        self.known_lines += 1
        key = (int(m[1]), int(m[2]))
        self.in_flight.discard(key)
        self._seen(key[0])
        p = self._pending.pop(key, None)
        if key in self._timed:
            self._timed.discard(key)
        elif p is None:
            self.untimed += 1
        if p is None:
            return None
        return p.request(key[0], key[1], at, int(m[3]), m[4] == "1")

    def _launch(self, line: str) -> None:
        m = _LAUNCH.search(line)
        if m is None:
            return
        self.known_lines += 1
        slot, task = int(m[1]), int(m[2])
        self._seen(slot)
        # A slot runs one task at a time: a task of this slot still "in flight" lost its
        # release line and must not stay counted forever.
        stale = [k for k in self.in_flight if k[0] == slot]
        for k in stale:
            self.in_flight.discard(k)
        if len(self.in_flight) >= MAX_PENDING:
            self.in_flight.pop()
        self.in_flight.add((slot, task))
