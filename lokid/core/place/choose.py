"""Which GPUs a start of a ``gpus = "auto"`` / ``gpu_count = N`` preset gets (issue 29, item 3).

``lokid prestart`` sizes the start (:func:`lokid.core.place.need.size_plan`: ``count``
GPUs of ``per_gpu`` bytes each), reads how much each GPU has free now, less its reserve
and less what starts still loading have claimed and not taken yet, and asks
:func:`choose`:

- **best fit**: among the GPUs that hold ``per_gpu`` now, the ``count`` with the least
  room left, so that the largest free rooms stay whole for the presets that need them
  (the gateway's own decision, :func:`lokid.core.place.policy.decide`, places by the
  same rule, so both choose alike on the same figures);
- **a replica apart from its siblings** (issue 47): the GPUs the preset's other engines
  run on (``avoid``) come last among those that hold it: two replicas packed on one GPU
  by best fit share its compute, and the second adds memory use and no throughput;
  where only those hold it, it goes there all the same, and says so;
- where fewer than ``count`` hold it now, the ``count`` with the most free memory, and
  said: a start by hand is not refused here (the gateway waits or evicts before it
  starts one; ``systemctl start`` is the operator's own call), but its journal says it
  may not load;
- no GPU known (none on the host, none the engine can use): nothing is chosen and the
  engine sees every device it would without lokid.

Pure: the caller reads the devices and the other starts' claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .policy import HOST, size_text


@dataclass(frozen=True)
class Choice:
    gpus: tuple[str, ...]     # "GPU1", "GPU3" (sorted by index); () = none chosen
    why: str                  # one line for the journal and the runtime plan's notes
    fits: bool = True         # False: chosen where it may not load

    def visible(self) -> str:
        """CUDA_VISIBLE_DEVICES for the choice: the indices, comma-separated."""
        return ",".join(g.removeprefix("GPU") for g in self.gpus)


def _index(name: str) -> int:
    digits = name.removeprefix("GPU")
    return int(digits) if digits.isdigit() else 1 << 30


def choose(count: int, per_gpu: int, room: Mapping[str, int],
           claimed: Mapping[str, int] | None = None,
           avoid: frozenset[str] = frozenset()) -> Choice:
    """``count`` GPUs of ``room`` (bytes each may still take now: free less reserve) for
    ``per_gpu`` bytes each; ``claimed``: what other starts still loading will take there
    (already subtracted from ``room``; only for the words); ``avoid``: the GPUs of the
    preset's other replicas, taken last."""
    gpus = {name: left for name, left in room.items() if name != HOST}
    if count <= 0 or not gpus:
        return Choice((), "no GPU to choose from: the engine sees the devices it finds")
    claimed = {k: v for k, v in (claimed or {}).items() if v > 0}
    fits = sorted((name in avoid, left, _index(name), name) for name, left in gpus.items()
                  if left >= per_gpu)
    each = "" if count == 1 else " each"
    if len(fits) >= count:
        chosen = sorted((name for *_, name in fits[:count]), key=_index)
        where = ", ".join(f"{n} has {size_text(gpus[n])} free" for n in chosen)
        why = (f"GPUs chosen: {', '.join(chosen)} (needs {size_text(per_gpu)}{each}; "
               f"{where}; the best fit of {len(gpus)} GPU{'s' if len(gpus) > 1 else ''})")
        shared = sorted(set(chosen) & avoid, key=_index)
        if avoid:
            why += (f"; beside its replicas on {', '.join(shared)}: no other GPU holds it"
                    if shared else f"; apart from its replicas on "
                    f"{', '.join(sorted(avoid, key=_index))}")
        return Choice(tuple(chosen), why + _claims(claimed))
    most = sorted(gpus.items(), key=lambda kv: (-kv[1], _index(kv[0])))[:count]
    chosen = sorted((name for name, _ in most), key=_index)
    where = ", ".join(f"{n} has {size_text(gpus[n])} free" for n in chosen)
    why = (f"GPUs chosen: {', '.join(chosen)}, where the most memory is free, though it "
           f"needs {size_text(per_gpu)}{each} and {where}: the engine may fail to load "
           "(the gateway would have evicted or waited first)")
    return Choice(tuple(chosen), why + _claims(claimed), fits=False)


def _claims(claimed: Mapping[str, int]) -> str:
    if not claimed:
        return ""
    return "; counted as taken by starts still loading: " + ", ".join(
        f"{size_text(n)} on {d}" for d, n in sorted(claimed.items(), key=lambda kv: _index(kv[0])))
