"""What a start of a preset needs on each device, from its plan (issue 29, items 2 and 4).

The figure per device is the footprint measured for the plan's memory key where one is
kept (:mod:`lokid.core.place.footprint`), else the estimate from the GGUF header
(:mod:`lokid.core.place.estimate`) for the shape the command line asks for:

- ``-c`` (0: the model's own context length, as llama-server does), ``-ngl`` (absent,
  ``auto`` or ``all``: every layer, the most it can hold), ``-np`` (absent: 4, the
  engine's automatic slot count), ``-ctk``/``-ctv``, ``-ub`` (512), ``-fa`` (off only
  when said), ``--no-kv-unified``; the last occurrence wins, as in the engine;
- the devices the engine sees: none for an engine without a GPU backend or a host
  without GPUs (everything on the host, as llama.cpp falls back to the CPU); the GPUs
  named by ``CUDA_VISIBLE_DEVICES`` (the preset's ``gpus``) as ``GPU<n>``; UUIDs
  (``GPU-…``, ``MIG-…``) as the device the driver gave that UUID (``GPU1``, a MIG
  instance ``GPU0/MIG2``: issue 44, item 8; sized as "a GPU to choose", a preset pinned to
  a 10 GiB MIG instance was judged on the whole 80 GiB card), and only where one is not
  known to the driver (none read, or not on this host) as a count of GPUs to be chosen;
  a footprint measured under a UUID's name counts on that device; ``gpus = "auto"`` (the fewest
  GPUs whose even share fits the largest ones, :func:`fewest_gpus`) and ``gpu_count``
  as a count too, chosen at start (:mod:`lokid.planning.gpuchoice`); else every GPU of
  the host;
- a projector (``--mmproj``) or a draft model adds its file's bytes to the weights of the
  device that runs the layers (the first GPU, else the host): their buffers are not
  estimated one by one, and the file is what they load;
- the engine process itself holds :data:`ENGINE_BASE` on the host beyond its buffers (its
  code, libraries and allocator: the CPU build b11434 with the 0.5 MB test model was
  measured at 24 MiB resident by the daemon; a GPU build's runtime holds more, which its
  first measured load then says).

Where a device is measured and another is not (a host figure from the cgroup, no driver
for the GPU), each keeps its own source. Pure: the caller reads the files and devices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..launch.flags import flag_value, has_flag
from ..model.modelinfo import ModelInfo
from .estimate import Estimate, estimate
from .footprint import ESTIMATE, SOURCE_WORDS, Footprint
from .policy import HOST, Need, size_text

DEFAULT_PARALLEL = 4     # llama-server's -np auto
ENGINE_BASE = 24 * 2**20   # a llama-server process's own resident memory (see above)
DEFAULT_UBATCH = 512

CTX = ("-c", "--ctx-size")
NGL = ("-ngl", "--gpu-layers", "--n-gpu-layers")
PARALLEL = ("-np", "--parallel")
CACHE_K = ("-ctk", "--cache-type-k")
CACHE_V = ("-ctv", "--cache-type-v")
UBATCH = ("-ub", "--ubatch-size")
FLASH = ("-fa", "--flash-attn")
MMPROJ = ("-mm", "--mmproj")
DRAFT = ("-md", "--model-draft")


@dataclass(frozen=True)
class Sizing:
    """A preset's need, and where each figure comes from."""

    need: Need
    sources: Mapping[str, str]      # device → one of footprint.SOURCES
    head: str                       # "needs 17.6 GiB on GPU0 (…) and 1.2 GiB on host (…)"
    basis: str                      # what the estimate is made of ("" when all measured)

    @property
    def text(self) -> str:
        """One line for lokid plan, lokictl and the journal."""
        return f"{self.head}; {self.basis}" if self.basis else self.head

    @property
    def measured(self) -> bool:
        return any(s != ESTIMATE for s in self.sources.values())


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def shape(argv: Sequence[str], model: ModelInfo) -> dict[str, object]:
    """The estimate's arguments from the command line (see the module docstring)."""
    args = list(argv[1:])
    ctx = _int(flag_value(args, *CTX), 0)
    if ctx <= 0:
        ctx = max(0, model.context_length)
    ngl_text = flag_value(args, *NGL)
    gpu_layers: int | None = None
    if ngl_text is not None and ngl_text not in ("auto", "all") and _int(ngl_text, -1) >= 0:
        gpu_layers = _int(ngl_text, 0)
    n_parallel = _int(flag_value(args, *PARALLEL), DEFAULT_PARALLEL)
    flash = (flag_value(args, *FLASH) or "on").lower() not in ("off", "0", "false", "no")
    return {
        "ctx": ctx,
        "gpu_layers": gpu_layers,
        "n_parallel": n_parallel if n_parallel > 0 else DEFAULT_PARALLEL,
        "kv_type_k": flag_value(args, *CACHE_K) or "f16",
        "kv_type_v": flag_value(args, *CACHE_V) or "f16",
        "ubatch": max(1, _int(flag_value(args, *UBATCH), DEFAULT_UBATCH)),
        "flash_attn": flash,
        "kv_unified": not has_flag(args, "--no-kv-unified", "-no-kvu"),
    }


def engine_gpus(env: Mapping[str, str], host_gpus: Sequence[str],
                gpu_engine: bool, choose: int = 0,
                uuids: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], int]:
    """The GPUs the engine will use: (names, 0) when they are known by index or by a UUID
    in ``uuids`` (the driver's: UUID → name), ((), n) when ``n`` GPUs named by UUIDs the
    driver did not give are to be found, or ``choose`` GPUs are to be chosen at start
    (``gpus = "auto"``, ``gpu_count``), ((), 0) for none."""
    if not gpu_engine:
        return (), 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None and choose > 0:
        return (), min(choose, len(host_gpus)) if host_gpus else 0
    if visible is None:
        return tuple(host_gpus), 0
    items = [s.strip() for s in visible.split(",") if s.strip()]
    if items and all(s.isdigit() and len(s) < 4 for s in items):
        return tuple(f"GPU{int(s)}" for s in items), 0
    named = [(uuids or {}).get(s) for s in items]
    if items and all(named):
        return tuple(n for n in named if n), 0
    return (), len(items)


def fewest_gpus(per_gpu: Callable[[int], int], capacity: Mapping[str, int]) -> int:
    """``gpus = "auto"``: the fewest GPUs whose share (``per_gpu(k)`` each, layers split
    evenly) the ``k`` largest of ``capacity`` each hold; every GPU when none does (the
    refusal then gives the figures); 1 when their sizes are unknown."""
    sizes = sorted(capacity.values(), reverse=True)
    for k in range(1, len(sizes) + 1):
        if per_gpu(k) <= sizes[k - 1]:
            return k
    return max(1, len(sizes))


def size_plan(preset: str, argv: Sequence[str], env: Mapping[str, str], model: ModelInfo, *,
              host_gpus: Sequence[str] = (), gpu_free: Mapping[str, int] | None = None,
              gpu_engine: bool = False, extra: Mapping[str, int] | None = None,
              footprint: Footprint | None = None, cost: float | None = None,
              gpu_choice: int | None = None,
              gpu_capacity: Mapping[str, int] | None = None,
              gpu_uuids: Mapping[str, str] | None = None) -> Sizing:
    """The need of a start of ``argv`` (its plan) on this host's devices.

    ``host_gpus``: the host's GPUs (``GPU0``…), ``gpu_free`` their usable bytes (the layer
    split), ``gpu_engine`` whether the engine has a GPU backend, ``extra`` the bytes of
    files loaded beside the model by name (``{"mmproj": n}``), ``footprint`` the one
    measured for this plan's key, ``cost`` its measured load in seconds; ``gpu_choice``
    the preset's ``gpus = "auto"`` (0) or ``gpu_count`` (N) where its plan has no
    CUDA_VISIBLE_DEVICES yet, ``gpu_capacity`` what each GPU can hold (for "auto": how
    many it takes), ``gpu_uuids`` the driver's UUID of each device → its name. Raises
    ValueError for a KV cache type the estimate does not know."""
    choose = 0
    if gpu_choice is not None and "CUDA_VISIBLE_DEVICES" not in env and host_gpus:
        choose = gpu_choice
        if choose == 0:
            capacity = {g: (gpu_capacity or {}).get(g, 0) for g in host_gpus}
            choose = fewest_gpus(
                lambda k: size_plan(preset, argv, env, model, host_gpus=host_gpus,
                                    gpu_engine=gpu_engine, extra=extra, footprint=footprint,
                                    gpu_choice=k).need.per_gpu,
                capacity) if all(capacity.values()) else 1
    names, by_uuid = engine_gpus(env, host_gpus, gpu_engine, choose, gpu_uuids)
    count = len(names) or by_uuid
    free = [max(0, (gpu_free or {}).get(n, 0)) for n in names] if names else [0] * by_uuid
    if free and not all(free):
        free = [0] * len(free)   # one unknown: llama.cpp's split cannot be told; even
    est = estimate(model, devices=count, free=free or None, **shape(argv, model))  # type: ignore[arg-type]
    extras = {k: v for k, v in (extra or {}).items() if v > 0}
    estimated: dict[str, int] = {HOST: est.host.total + ENGINE_BASE}
    gpu_parts = [p.total for p in est.gpus]
    if extras:
        if gpu_parts:
            gpu_parts[0] += sum(extras.values())
        else:
            estimated[HOST] += sum(extras.values())
    for name, nbytes in zip(names, gpu_parts[:len(names)], strict=True):
        estimated[name] = nbytes
    held: dict[str, int] = dict(estimated)
    sources = {d: ESTIMATE for d in held}
    if footprint is not None:
        for device, nbytes in footprint.held.items():
            name = (gpu_uuids or {}).get(device, device)   # booked under its UUID
            if name in held and footprint.sources.get(device, ESTIMATE) != ESTIMATE:
                held[name] = nbytes
                sources[name] = footprint.sources[device]
    per_gpu = max(gpu_parts) if by_uuid and gpu_parts else 0
    per_gpu_source = ESTIMATE
    if by_uuid and footprint is not None:   # measured on as many GPUs, whichever they were
        measured = [(n, footprint.sources[d]) for d, n in footprint.held.items()
                    if d != HOST and footprint.sources.get(d, ESTIMATE) != ESTIMATE]
        if len(measured) == by_uuid:
            per_gpu, per_gpu_source = max(measured)
    need = Need(preset, held, per_gpu=per_gpu, count=by_uuid, cost=cost)
    return Sizing(need, sources, *_text(need, sources, est, estimated, extras,
                                        per_gpu_source))


def _text(need: Need, sources: Mapping[str, str], est: Estimate, estimated: Mapping[str, int],
          extras: Mapping[str, int], per_gpu_source: str = ESTIMATE) -> tuple[str, str]:
    """The need ("needs 17.6 GiB on GPU0 (…) and 1.2 GiB on host (estimated)"), and what
    the estimate is made of ("" when every figure was measured)."""
    parts = []
    for device in sorted(need.fixed, key=lambda d: (d == HOST, d)):
        got = need.fixed[device]
        source = sources.get(device, ESTIMATE)
        words = "estimated" if source == ESTIMATE else SOURCE_WORDS.get(source, source)
        text = f"{size_text(got)} on {device} ({words}"
        if source != ESTIMATE and device in estimated and got > 0:
            text += f"; estimated {size_text(estimated[device])}"
        parts.append(text + ")")
    if need.count:
        where = "one GPU" if need.count == 1 else f"each of {need.count} GPUs"
        words = "estimated" if per_gpu_source == ESTIMATE else \
            SOURCE_WORDS.get(per_gpu_source, per_gpu_source)
        parts.append(f"{size_text(need.per_gpu)} on {where} ({words})")
    basis = ""
    if any(s == ESTIMATE for s in sources.values()) or (
            need.count and per_gpu_source == ESTIMATE):
        basis = f"the estimate: {est.why}; plus the engine's own {size_text(ENGINE_BASE)} " \
            "on host"
        if extras:
            basis += "; plus " + ", ".join(f"{k} {size_text(v)}" for k, v in extras.items())
    return "needs " + " and ".join(parts), basis
