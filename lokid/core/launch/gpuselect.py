"""How a preset's GPUs reach the engine, numbered as lokid numbers them (issue 44, items 4
and 7).

lokid names GPUs ``GPU<n>`` by one numbering: NVML's, the PCI bus order that
``nvidia-smi`` shows, where the NVIDIA driver answers (Devices, Memory, footprints,
out-of-memory lines, ``gpus = "auto"``'s choice); else the engine's own
``llama-server --list-devices`` (``CUDA0`` → ``GPU0``, ``Vulkan1`` → ``GPU1``). The
rules, each with the failure it prevents:

- **CUDA_DEVICE_ORDER=PCI_BUS_ID goes wherever CUDA_VISIBLE_DEVICES goes** (the unit's
  drop-in, the plan and so the runtime plan and the engine's environment under systemd
  and under the local runner, ``lokid plan``): CUDA numbers GPUs fastest first unless
  told otherwise, so on a host of mixed GPUs ``gpus = [0]`` pinned CUDA's fastest GPU
  while lokid booked, watched and sized NVML's GPU0, another card. The engine's
  ``--list-devices`` that lokid reads where NVML cannot answer runs under the same
  order (:func:`listing_env`), so its ``CUDA<n>`` is NVML's ``GPU<n>`` too.
- **An operator's own CUDA_DEVICE_ORDER in the preset's ``env`` wins**, and the plan
  says that lokid's numbers are NVML's and may then name other GPUs than the engine's
  (:func:`order_note`): lokid cannot renumber its figures after the engine's order.
- **ROCm** (the HIP backend) reads ``CUDA_VISIBLE_DEVICES`` as ``HIP_VISIBLE_DEVICES``
  (ROCm's "GPU isolation" variables) and ignores ``CUDA_DEVICE_ORDER``; its order is
  HIP's (ROCr's enumeration, which ``rocm-smi`` may number otherwise). lokid reads AMD
  GPUs only from the engine's ``--list-devices`` (``ROCm<n>``), which is that same
  order, so one numbering holds without writing ``HIP_VISIBLE_DEVICES`` or
  ``ROCR_VISIBLE_DEVICES`` (lokid writes neither; an operator's in ``env`` is theirs).
- **A Vulkan engine gets llama.cpp's ``--device``**, as its variable
  ``LLAMA_ARG_DEVICE=Vulkan<n>,…`` (:func:`vulkan_devices`): ggml-vulkan ignores
  ``CUDA_VISIBLE_DEVICES``, so the engine spread over every GPU while lokid booked one.
  Not ``GGML_VK_VISIBLE_DEVICES``: its indices are the Vulkan loader's raw list of
  physical devices, CPU devices (Mesa's lavapipe) and one GPU seen by two drivers
  included, while ``--device`` takes the names ``--list-devices`` prints (the default
  list: GPUs only, one per card), the names lokid's room is read by where NVML is
  not. ``--device`` also leaves the names as they are (``Vulkan1`` stays ``Vulkan1``
  in the engine's buffer lines), and works for every backend. The variable rather
  than the flag: the choice stays in the environment beside ``CUDA_VISIBLE_DEVICES``
  (``gpus = "auto"``'s choice at start adds both, the argv is untouched), and a
  ``--device`` in ``extra_args`` still wins, as a flag beats its variable.
- **Vulkan's order is its driver's**, not NVML's, and nothing lokid reads maps one to
  the other before the engine runs (``--list-devices`` prints no PCI bus id): where
  NVML numbers the GPUs, ``GPU1`` may be another card than ``Vulkan1``. The plan says
  so rather than pretend; the engine's ``using device Vulkan1 (…) (<PCI bus id>)`` line
  (verbosity 4) names the card.
- An engine with the Vulkan backend and another GPU backend (CUDA) is not given
  ``--device``: it would drop the other backend's GPUs. llama.cpp uses a GPU hidden
  from CUDA through Vulkan, so such an engine still spreads: the plan says so.

Pure: the caller knows the engine's backends (:mod:`lokid.core.launch.caps`) and the preset.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .caps import EngineCaps

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
PCI_ORDER = "PCI_BUS_ID"
DEVICE_VAR = "LLAMA_ARG_DEVICE"       # llama-server's --device (-dev)
VULKAN = "vulkan"
VULKAN_DEVICE = "Vulkan"              # ggml-vulkan's device names: Vulkan0, Vulkan1…


def visible_env(visible: str, preset_env: Mapping[str, str]) -> dict[str, str]:
    """The engine's CUDA_VISIBLE_DEVICES for ``visible`` and, unless the preset's env
    orders the GPUs itself, CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML's numbering)."""
    env = {VISIBLE: visible}
    if ORDER not in preset_env:
        env[ORDER] = PCI_ORDER
    return env


def listing_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for an engine's ``--list-devices``: ``environ`` with
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so that its ``CUDA<n>`` is the ``GPU<n>`` lokid
    writes into CUDA_VISIBLE_DEVICES."""
    return {**environ, ORDER: PCI_ORDER}


def order_note(preset_env: Mapping[str, str]) -> str:
    """What an operator's own CUDA_DEVICE_ORDER means for lokid's GPU numbers ("" for
    none, or PCI_BUS_ID)."""
    value = preset_env.get(ORDER)
    if value is None or value.strip() == PCI_ORDER:
        return ""
    return (f"env.CUDA_DEVICE_ORDER = {value}: CUDA numbers the engine's GPUs in that "
            "order, while lokid's GPU numbers (gpus, Devices, Memory, footprints, "
            "out-of-memory lines) are NVML's, in PCI bus order as nvidia-smi shows them: "
            "GPU<n> may be another card than the engine's CUDA<n> (remove it to have "
            "one numbering)")


def _indices(visible: str) -> list[str] | None:
    items = [s.strip() for s in visible.split(",") if s.strip()]
    return items if items and all(s.isdigit() for s in items) else None


def vulkan_devices(visible: str, caps: EngineCaps, by_hand: bool
                   ) -> tuple[dict[str, str], str]:
    """What the engine's environment gets so that a Vulkan engine uses the GPUs
    ``visible`` names (CUDA_VISIBLE_DEVICES' indices), and a note ("" for none): ({}, "")
    for an engine without the Vulkan backend, or one whose backends are unknown.
    ``by_hand``: the operator sets ``--device`` (extra_args, LLAMA_ARG_DEVICE)."""
    backends = caps.gpu_backends
    if not backends or VULKAN not in backends:
        return {}, ""
    if by_hand:
        return {}, (f"gpus = {visible}: the Vulkan backend ignores CUDA_VISIBLE_DEVICES, "
                    "and --device set by hand chooses its GPUs; lokid books the ones gpus "
                    "names")
    others = [b for b in backends if b != VULKAN]
    if others:
        from .caps import backend_label

        return {}, (f"gpus = {visible} restricts {backend_label(others)} only "
                    "(CUDA_VISIBLE_DEVICES): the Vulkan backend of this engine sees "
                    "every GPU, and llama.cpp uses one hidden from the other backend "
                    "through it; set --device in extra_args to choose (`llama-server "
                    "--list-devices` names them)")
    if not caps.knows("--device"):
        return {}, (f"gpus = {visible}: this engine does not know --device, so its Vulkan "
                    "backend uses every GPU it finds while lokid books the ones gpus "
                    "names")
    indices = _indices(visible)
    if indices is None:
        return {}, (f"gpus = {visible}: GPUs named by UUID cannot be passed to the Vulkan "
                    "backend, which uses every GPU it finds; name them by index, or set "
                    "--device Vulkan<n> in extra_args")
    names = ",".join(f"{VULKAN_DEVICE}{int(i)}" for i in indices)
    gpus = ", ".join(f"GPU{int(i)}" for i in indices)
    return {DEVICE_VAR: names}, (
        f"gpus = {visible} on the Vulkan backend: {DEVICE_VAR}={names} (--device; "
        "CUDA_VISIBLE_DEVICES does not reach Vulkan). Vulkan numbers GPUs in its "
        "driver's order (`llama-server --list-devices`): where the NVIDIA driver numbers "
        f"lokid's GPUs (nvidia-smi's order), {gpus} may be another card than {names}; "
        "the engine's `using device` line (verbosity 4) names its card's PCI bus id")
