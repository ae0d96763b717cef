"""What a preset will hold on each device, estimated from its GGUF header (issue 29).

Before an engine has run once there is no measurement, so the placement rule
(:mod:`lokid.core.place.policy`) starts from this estimate; once the engine ran, its
own buffer lines replace it. The parts are the three buffers llama.cpp b11434 prints:

- **model** (``load_tensors: <dev> model buffer size``): the tensor bytes of the
  header. llama.cpp's ``-ngl N`` counts the blocks and the output layer as N+1
  "layers"; the last N go to the GPUs (``i_gpu_start = n_layer + 1 - N``), the
  output layer only when every block went. ``token_embd`` always stays on the host
  (its get_rows runs there); a model without ``output.weight`` (tied embeddings)
  gets a copy of ``token_embd`` as its output, on the output layer's device.
- **KV** (``llama_kv_cache: <dev> KV buffer size``): exact arithmetic, per layer with
  KV, on that layer's device: ``ctx × (row(type_k, key_length × heads_kv) +
  row(type_v, value_length × heads_kv))``. ``ctx`` is the whole ``-c``: the slots
  share it (llama-server's unified KV, or ``-c / -np`` cells for each of ``-np``
  streams: the same total). The NextN/MTP blocks (the last ``nextn_predict_layers``)
  hold no KV in the main context (b11434 prints "8 layers" for a 9-block GLM with
  MTP); the draft context's own KV is not counted here. Recurrent state (hybrids'
  SSM layers) is not estimated: a per-layer ``head_count_kv`` of 0 leaves them out.
- **compute** (``sched_reserve: <dev> compute buffer size``): an estimate fitted on
  the engine's own figures, not derived from its graph allocator. On the device that
  runs the layers::

      ubatch × (2·n_kv + 12·n_ff + 20·n_embd) [+ ubatch × n_kv × n_head × 4 without
      flash attention] + 4 · n_vocab · n_parallel

  ``2·n_kv`` is the f16 attention mask (``n_kv`` = ``ctx``, or ``ctx / n_parallel``
  without a unified cache), ``12·n_ff`` the live FFN activations in f32, ``20·n_embd``
  the residual stream's live copies, the last term the logits of one output row per
  sequence. On b11434's CPU build it lands within 3 % of the engine for six shapes
  (n_embd 64–1024, n_ff 128–2048, ctx 512–16384, ubatch 128/512, -np 4) except a
  32k-vocabulary model at +14 %; on the CUDA log of a 3.36 GB GLM (n_embd 4096,
  n_ff 12288, -c 8192) it says 120 MiB where the engine said 112.01 MiB. With a GPU,
  the host keeps a pinned buffer of ``ubatch × (4·n_kv + 12·n_embd)`` bytes (40.02
  MiB in that log: 40 estimated), and a GPU that has only part of the blocks also
  receives the largest host weight for big batches (llama.cpp's op offload: 192 MiB
  there, the GLM's expert tensor), so its compute is at least that tensor.

Several GPUs: :func:`layer_devices` is llama.cpp's default layer split, by the share
of each GPU's free memory; each GPU that runs layers gets its own compute buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model.modelinfo import ModelInfo
from .policy import size_text

# ggml type name -> (elements per block, bytes per block): the types llama.cpp accepts
# for --cache-type-k/-v (kv_cache_types in common/arg.cpp).
KV_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
    "q4_1": (32, 20), "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}


@dataclass(frozen=True)
class Part:
    """Bytes one device holds for one engine, by buffer."""

    model: int = 0
    kv: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return self.model + self.kv + self.compute

    def __add__(self, other: Part) -> Part:
        return Part(self.model + other.model, self.kv + other.kv,
                    self.compute + other.compute)


@dataclass(frozen=True)
class Estimate:
    """One preset's footprint: per GPU (device order), on the host, and why."""

    gpus: tuple[Part, ...]
    host: Part
    offloaded: int          # llama.cpp's "offloaded N/M layers": N (output counted)
    layers: int             # M: blocks + output
    why: str

    @property
    def gpu(self) -> Part:
        """Every GPU's part together."""
        total = Part()
        for p in self.gpus:
            total += p
        return total

    @property
    def total(self) -> int:
        return self.gpu.total + self.host.total


def row_bytes(kv_type: str, elements: int) -> int:
    """ggml_row_size: bytes of one row of ``elements`` values of ``kv_type``."""
    try:
        per_block, nbytes = KV_TYPES[kv_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {kv_type!r} "
                         f"(valid: {', '.join(KV_TYPES)})") from None
    return -(-elements // per_block) * nbytes


def layer_devices(n_blocks: int, gpu_layers: int, free: Sequence[int]) -> tuple[int | None, ...]:
    """The device of each of the ``n_blocks + 1`` layers (the last is the output layer):
    an index into ``free``, or None for the host.

    llama.cpp's default split (``llama_model::load_tensors``, split mode layer, no
    ``--tensor-split``): the last ``gpu_layers`` layers go to the GPUs, layer ``il``
    to the first device whose cumulative share of the free memory exceeds
    ``(il - i_gpu_start) / gpu_layers``. No GPU free memory known: an even split.
    """
    n_layers = n_blocks + 1
    act = max(0, min(gpu_layers, n_layers)) if free else 0
    start = n_layers - act
    shares = [max(0, f) for f in free]
    if sum(shares) == 0:
        shares = [1] * len(free)
    cumulative, acc = [], 0
    for s in shares:
        acc += s
        cumulative.append(acc / sum(shares))
    out: list[int | None] = []
    for il in range(n_layers):
        if il < start:
            out.append(None)
            continue
        x = (il - start) / act
        dev = next((i for i, c in enumerate(cumulative) if c > x), len(free) - 1)
        out.append(dev)
    return tuple(out)


def _activations(info: ModelInfo, n_kv: int, *, ubatch: int, n_parallel: int,
                 flash_attn: bool) -> int:
    """The compute buffer of the device that runs the layers (see the module doc)."""
    n = ubatch * (2 * n_kv + 12 * max(0, info.n_ff) + 20 * max(0, info.n_embd))
    if not flash_attn:
        n += ubatch * n_kv * max(0, info.head_count) * 4
    return n + 4 * max(0, info.n_vocab) * n_parallel


def estimate(info: ModelInfo, ctx: int, *, gpu_layers: int | None = None, n_parallel: int = 1,
             kv_type_k: str = "f16", kv_type_v: str = "f16", devices: int = 1,
             ubatch: int = 512, free: Sequence[int] | None = None, flash_attn: bool = True,
             kv_unified: bool = True) -> Estimate:
    """Bytes per place for ``info`` run with ``-c ctx -ngl gpu_layers -np n_parallel
    -ctk/-ctv -ub ubatch`` on ``devices`` GPUs (0: a CPU-only engine).

    ``gpu_layers`` None means all (``-ngl all``). ``free`` (bytes per GPU) sets the
    layer split and the number of GPUs; without it the split is even. Raises
    ValueError for an unknown KV type, nothing else: odd header figures (0 heads, a
    missing shape) give smaller estimates, never an exception.
    """
    row_bytes(kv_type_k, 0)           # refuse an unknown type even when no layer has KV
    row_bytes(kv_type_v, 0)
    shares: Sequence[int] = list(free) if free is not None else [0] * max(0, devices)
    ctx = max(0, ctx)
    n_parallel = max(1, n_parallel)
    n_blocks = max(info.block_count, len(info.block_bytes), 0)
    ngl = n_blocks + 1 if gpu_layers is None else max(0, gpu_layers)
    where = layer_devices(n_blocks, ngl, shares)
    gpus = [Part() for _ in shares]
    host = Part()

    def add(dev: int | None, part: Part) -> None:
        nonlocal host
        if dev is None:
            host += part
        else:
            gpus[dev] += part

    # Weights.
    for il in range(n_blocks):
        nbytes = info.block_bytes[il] if il < len(info.block_bytes) else 0
        add(where[il], Part(model=nbytes))
    output = info.output_bytes + (info.token_embd_bytes if info.output_tied else 0)
    add(where[n_blocks], Part(model=output))
    host += Part(model=info.token_embd_bytes)

    # KV, on the device of its layer.
    kv_layers = max(0, info.block_count - max(0, info.nextn_predict_layers))
    per_layer = info.head_count_kv_per_layer
    heads_text = set()
    for il in range(kv_layers):
        heads = per_layer[il] if il < len(per_layer) else info.head_count_kv
        heads = max(0, heads)
        heads_text.add(heads)
        kv = ctx * (row_bytes(kv_type_k, info.key_length * heads)
                    + row_bytes(kv_type_v, info.value_length * heads))
        add(where[il] if il < n_blocks else None, Part(kv=kv))

    # Compute.
    n_kv = ctx if kv_unified else ctx // n_parallel
    act = _activations(info, n_kv, ubatch=ubatch, n_parallel=n_parallel,
                       flash_attn=flash_attn)
    partial = any(d is None for d in where[:n_blocks])
    for i in range(len(gpus)):
        runs = i in where
        need = max(act if runs else 0, info.max_block_tensor_bytes if partial else 0)
        gpus[i] += Part(compute=need)
    if gpus:
        host += Part(compute=ubatch * (4 * n_kv + 12 * max(0, info.n_embd)))
    else:
        host += Part(compute=act)

    offloaded = sum(d is not None for d in where)
    heads_shown = "/".join(str(h) for h in sorted(heads_text)) or "0"
    kv_total = sum(p.kv for p in gpus) + host.kv
    kv_why = (f"KV {size_text(kv_total)} ({ctx} × {kv_layers} layers × {heads_shown} heads "
              f"× ({info.key_length} {kv_type_k} + {info.value_length} {kv_type_v}))")
    places = []
    for i, p in enumerate(gpus):
        places.append(f"GPU{i}: weights {size_text(p.model)} + KV {size_text(p.kv)} "
                      f"+ compute {size_text(p.compute)}")
    places.append(f"host: weights {size_text(host.model)} + KV {size_text(host.kv)} "
                  f"+ compute {size_text(host.compute)}")
    why = (f"offloaded {offloaded}/{n_blocks + 1} layers; {kv_why}; " + "; ".join(places))
    return Estimate(gpus=tuple(gpus), host=host, offloaded=offloaded, layers=n_blocks + 1,
                    why=why)
