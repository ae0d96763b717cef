#!/usr/bin/env python3
"""The peers' placement rules in benchmarks/placement_sim.py, each given the best
configuration its own documentation allows on 2 × 80 GiB GPUs (issue 47, item 4).

The first version (issue 29) ran llama-swap as one swap group on one GPU, a
configuration no user of two GPUs would write (790 cold starts per 1,000 requests), and
drew Ollama's estimate error from an assumed ±25 %. Each rule here follows what the
peer's code does, and where a setting is the user's, the one that serves this trace best:

- **llama-swap, group router** (the default router; docs/kb/guides/routing/
  groups-and-matrix.md, proxy/processgroup.go), as a user of two GPUs writes it: the six
  smallest models (73.0 GiB, 73 % of the requests on seed 1) pinned to GPU0 in a group
  that neither swaps nor is exclusive (loaded once asked, then kept), the four big ones
  pinned to GPU1 in a swap group (one at a time). A swap holds the swap group's lock
  while the model it replaces finishes its requests (``Process.Stop``); the requests for
  GPU0's models pass no lock.
- **llama-swap, matrix router** (``routing.router.use: matrix``; the same guide and
  proxy/matrix.go): the user pins each model to a GPU (``env: CUDA_VISIBLE_DEVICES``)
  and lists the sets of models that may run together; here, every set of a GPU's models
  whose true footprints fit its 80 GiB, crossed with every such set of the other GPU (a
  user who measured every model: no out-of-memory start). A request for a model not
  running picks the set that contains it and evicts the least (each model's eviction
  cost: its load time, as llama-swap's measured median), ties by the sets' order. Which
  GPU each model is pinned to is searched: the 512 assignments (the first model on GPU0)
  replayed on a calibration trace of another seed, the one with the lowest p95 wait
  kept, then the fewest cold starts (:data:`MATRIX_GPU1`; ``placement_sim.py --tune``
  finds it again). What the code then does, and the simulation with it: requests pass
  one lock in their order of arrival; a request whose model needs an eviction holds the
  lock and first waits until every request that passed it has ended
  (``Matrix.ProxyRequest``: ``m.inflight.Wait()`` under ``m.Lock()``, and
  ``inflight.Done`` deferred past the proxied answer), on every model of both GPUs; the
  requests behind it wait with it. A request for a model that runs, or loads, passes.
  Beside it, the same rule where an eviction waits only for the evicted models' requests
  (*evicted*): what the matrix would give without that wait. The pinning is
  searched with that variant (with the code's wait every pinning falls behind the
  arrivals), and both rows use it.
- **llama.cpp's router** (``--models-max N``, LRU eviction; Hugging Face's "Model
  Management" post, default N = 4): a count, no memory. N = 2, 3 and 4 are all shown:
  which is best depends on what is weighed (fewer loads, or shorter waits with
  out-of-memory starts). A new engine goes on the GPU with more true free memory (kinder
  than the router's default, which splits every model over both GPUs).
- **Ollama** (server/sched.go), ``OLLAMA_MAX_LOADED_MODELS=10`` (no count below memory;
  the default is 3 per GPU), ``OLLAMA_SCHED_SPREAD`` unset (a model on one GPU where its
  estimate fits), ``OLLAMA_NUM_PARALLEL=4``, ``OLLAMA_KEEP_ALIVE=-1``. It evicts idle
  engines until its estimate fits the GPU with the most free memory, least recently used
  first (kinder than its code, which unloads by keep-alive, then by the model file's
  path); its pending queue is served one request at a time, so a request that waits for
  a busy engine holds back the ones behind it. An estimate over one GPU is split over
  both. Two estimates, each fixed per model (Ollama's is a function of the model and its
  options, not a draw per load):

  - *exact*: what Ollama's own engine now measures (ollama/ollama#12252, September 2025:
    new memory estimates on by default for models on the Ollama engine);
  - *errors from its issues*, for models on the llama.cpp engine, which keeps the old
    estimate: each model's estimate is its true footprint times one of the ratios
    (estimate ÷ true) reported in Ollama's issues (:data:`ESTIMATE_ERRORS`), drawn per
    model with the seed.
"""

# No "from __future__ import annotations": see benchmarks/placement_host.py.
import argparse
import itertools
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from lokid.core.place.policy import GIB

sys.path.insert(0, str(Path(__file__).resolve().parent))
from placement_host import GPU_BYTES, GPUS, PRESETS, Host, presets_of  # noqa: E402

# (estimate ÷ true footprint, the issue that reports it, what was reported). An
# under-estimate is an upper bound (the load failed: the true need was more).
ESTIMATE_ERRORS: tuple[tuple[float, str, str], ...] = (
    (0.87, "ollama/ollama#9170",
     "planned 13 layers on a 40,960 MiB GPU; one allocation of 46,964 MiB failed"),
    (0.93, "ollama/ollama#8471",
     "estimated 14.3 GiB of 15.4 GiB free; out of memory allocating 2,508 MiB more"),
    (0.96, "ollama/ollama#9782",
     "estimated 75.6 GiB on a GPU with 78.7 GiB free; out of memory at load"),
    (1.18, "ollama/ollama#6160",
     "ollama ps 29 GB where nvidia-smi shows 23,508 MiB (a 2024-10-02 comment)"),
    (2.11, "ollama/ollama#10359",
     "ollama ps 59 GB where nvidia-smi shows 11,856 + 8,624 + 6,214 MiB"),
)
# The models llama-swap's matrix pins to GPU1 (the rest to GPU0): found by
# ``placement_sim.py --tune`` (2,000 requests of seed 101, the lowest p95 wait of its
# evicted-drain variant).
MATRIX_GPU1: frozenset[str] = frozenset(
    {"qwen2.5-72b-q6", "gemma3-4b", "llama3.3-70b-q4", "qwen3-8b"})
# llama-swap's groups: the models a user of two GPUs keeps loaded together on GPU0 (the six
# smallest, 73.0 GiB together, 73 % of the requests on seed 1); the four big ones swap on
# GPU1
GROUP_RESIDENT: frozenset[str] = frozenset({
    "qwen3-14b", "llama3.1-8b", "gemma3-27b", "gemma3-4b", "mistral-nemo-12b", "qwen3-8b"})
OLLAMA_MAX_LOADED = 10


def fitting_sets(names: Sequence[str], sizes: Mapping[str, int],
                 room: int = GPU_BYTES) -> list[frozenset[str]]:
    """The maximal sets of ``names`` whose sizes fit ``room`` together (a subset of a set
    is allowed too, as in llama-swap's matrix), largest first, then by name."""
    fit = [frozenset(c) for k in range(1, len(names) + 1)
           for c in itertools.combinations(names, k) if sum(sizes[n] for n in c) <= room]
    maximal = [s for s in fit if not any(s < t for t in fit)]
    return sorted(maximal, key=lambda s: (-len(s), sorted(s)))


class LlamaSwap:
    """llama-swap: models pinned to GPUs, the sets of models that may run together, and
    the locks requests pass in their order of arrival (one for the matrix, one per swap
    group); a request that needs an eviction holds its lock until the drain it waits for
    is over."""

    def __init__(self, host: Host, gpu_of: Mapping[str, str], sets: Sequence[frozenset[str]],
                 locks: Sequence[frozenset[str]], *, drain_all: bool) -> None:
        self.host = host
        self.gpu_of = dict(gpu_of)
        self.sets = list(sets)
        self.locks = list(locks)
        # True: an eviction waits for every request in flight (the matrix's code); False:
        # for the evicted models' only (a swap group's Process.Stop)
        self.drain_all = drain_all
        self.evict_cost = {p: pr.load for p, pr in host.presets.items()}
        self.passed = {p: 0 for p in host.presets}   # requests past the lock, not served

    def solve(self, preset: str) -> list[str]:
        """The running models to evict for ``preset`` (llama-swap's MatrixSolver.Solve)."""
        running = list(self.host.engines)
        best: tuple[float, int] | None = None
        chosen: frozenset[str] = frozenset({preset})
        for i, s in enumerate(self.sets):
            if preset not in s:
                continue
            cost = sum(self.evict_cost[r] for r in running if r not in s)
            if best is None or (cost, i) < best:
                best, chosen = (cost, i), s
        return [r for r in running if r not in chosen]

    def _drained(self, evict: Sequence[str]) -> bool:
        h = self.host
        names = list(h.engines) if self.drain_all else evict
        return all(h.engines[p].in_flight == 0 and not self.passed[p] for p in names)

    def __call__(self) -> None:
        h = self.host
        for p, e in h.engines.items():   # the requests a load kept, served once it is ready
            while e.ready and self.passed[p]:
                self.passed[p] -= 1
                h.serve(p, head_only=True)
        for lock in self.locks:
            self._through(lock)

    def _through(self, lock: frozenset[str]) -> None:
        h = self.host
        while True:
            heads = [(q[self.passed[p]].arrival, p) for p, q in h.pending.items()
                     if p in lock and len(q) > self.passed[p]]
            if not heads:
                return
            _, preset = min(heads)
            if preset not in h.engines:
                evict = self.solve(preset)
                if evict and not self._drained(evict):
                    return   # it holds the lock: everyone behind it waits too
                for victim in evict:
                    h.stop(victim)
                h.start(preset, {self.gpu_of[preset]: h.presets[preset].footprint})
            if h.engines[preset].ready:
                h.serve(preset, head_only=True)
            else:
                self.passed[preset] += 1


def llama_swap_matrix(host: Host, gpu1: frozenset[str] = MATRIX_GPU1, *,
                      drain_all: bool = True) -> LlamaSwap:
    """The matrix router: ``gpu1`` pinned to the last GPU, the rest to the first; every
    set of a GPU's models that fits, crossed with the other GPU's; one lock."""
    gpu_of = {p: (host.gpus[-1] if p in gpu1 else host.gpus[0]) for p in host.presets}
    sizes = {p: pr.footprint for p, pr in host.presets.items()}
    per_gpu = [fitting_sets([p for p in host.presets if gpu_of[p] == g], sizes,
                            host.gpu_bytes) or [frozenset()] for g in host.gpus]
    sets = [frozenset().union(*combo) for combo in itertools.product(*per_gpu)]
    return LlamaSwap(host, gpu_of, sets, [frozenset(host.presets)], drain_all=drain_all)


def llama_swap_groups(host: Host, resident: frozenset[str] = GROUP_RESIDENT) -> LlamaSwap:
    """The group router: ``resident`` on the first GPU in a group that neither swaps nor is
    exclusive (all loaded together once asked), the rest on the last GPU in a swap group
    (one at a time, not exclusive). A swap waits for the swapped model's requests only,
    holding the swap group's lock; the resident group's requests pass no lock."""
    gpu_of = {p: (host.gpus[0] if p in resident else host.gpus[-1]) for p in host.presets}
    swapping = [p for p in host.presets if p not in resident]
    sets = [resident | {p} for p in swapping]
    locks = [frozenset({p}) for p in resident] + [frozenset(swapping)]
    return LlamaSwap(host, gpu_of, sets, locks, drain_all=False)


class RouterLRU:
    """llama-server's router with ``--models-max``: a count, no memory."""

    def __init__(self, host: Host, models_max: int) -> None:
        self.host = host
        self.models_max = models_max

    def __call__(self) -> None:
        h = self.host
        for preset in h.oldest():
            h.serve(preset)
        for preset in h.oldest():
            if preset in h.engines:
                continue
            if len(h.engines) >= self.models_max:
                idle = [e for e in h.engines.values() if e.ready and e.in_flight == 0]
                if not idle:
                    return
                h.stop(min(idle, key=lambda e: e.last_used).preset)
            gpu = max(h.gpus, key=lambda g: (h.free(g), -h.gpus.index(g)))
            h.start(preset, {gpu: h.presets[preset].footprint})


def estimate_ratios(presets: Sequence[str], seed: int) -> dict[str, float]:
    """Each model's estimate ÷ true footprint, one of :data:`ESTIMATE_ERRORS` per model."""
    rng = random.Random(f"ollama-errors-{seed}")
    return {p: rng.choice(ESTIMATE_ERRORS)[0] for p in presets}


class OllamaStyle:
    """Ollama's scheduler: an estimate fixed per model, idle engines evicted (LRU) until
    it fits the GPU with the most free memory, one pending request at a time."""

    def __init__(self, host: Host, ratios: Mapping[str, float] | None = None,
                 max_loaded: int = OLLAMA_MAX_LOADED) -> None:
        self.host = host
        self.max_loaded = max_loaded
        # each model's estimate (bytes): its true footprint where ``ratios`` is None
        self.drawn = {p: int(pr.footprint * (1.0 if ratios is None else ratios[p]))
                      for p, pr in host.presets.items()}

    def believed_free(self, gpu: str) -> int:
        h = self.host
        return h.gpu_bytes - sum((e.held if e.ready else e.known).get(gpu, 0)
                                 for e in h.engines.values())

    def __call__(self) -> None:
        h = self.host
        for preset in h.oldest():
            h.serve(preset)
        for preset in h.oldest():
            if preset in h.engines:
                continue
            true = h.presets[preset].footprint
            est = self.drawn[preset]
            while True:
                if est <= h.gpu_bytes:
                    gpu = max(h.gpus, key=lambda g: (self.believed_free(g), -h.gpus.index(g)))
                    place, known = {gpu: true}, {gpu: est}
                else:   # split over both GPUs
                    place = {g: true // len(h.gpus) for g in h.gpus}
                    known = {g: est // len(h.gpus) for g in h.gpus}
                if (len(h.engines) < self.max_loaded
                        and all(self.believed_free(g) >= n for g, n in known.items())):
                    break
                idle = [e for e in h.engines.values() if e.ready and e.in_flight == 0]
                if not idle:
                    return   # it waits for a busy engine, and the presets behind it too
                h.stop(min(idle, key=lambda e: e.last_used).preset)
            h.start(preset, place, known)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    presets = presets_of()
    host = Host(presets, GPUS, GPU_BYTES)
    matrix = llama_swap_matrix(host)
    for g in GPUS:
        names = [p for p, _ in PRESETS if matrix.gpu_of[p] == g]
        print(f"llama-swap matrix, {g}: {', '.join(names)}")
    print(f"  {len(matrix.sets)} sets, e.g. {', '.join(sorted(matrix.sets[0]))}")
    ratios = estimate_ratios([p for p, _ in PRESETS], args.seed)
    print(f"Ollama's estimate errors, seed {args.seed}:")
    for p, _ in PRESETS:
        print(f"  {p:18} × {ratios[p]:.2f}  {presets[p].footprint * ratios[p] / GIB:5.1f} GiB "
              f"believed of {presets[p].footprint / GIB:.1f}")
    for ratio, issue, what in ESTIMATE_ERRORS:
        print(f"  {ratio:.2f}: {issue}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
