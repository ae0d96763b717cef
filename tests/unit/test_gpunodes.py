"""lokid.unit.gpunodes: the NVIDIA driver's nodes, made by its own tool as root at boot.

The driver's tool is the stand-in nvidia-modprobe (tests/support/driverstandin.py),
compiled to make its nodes in a directory of the test's; its options are the real
tool's (NVIDIA/nvidia-modprobe). The driver's listing is in the format of
``/proc/driver/nvidia/gpus/<bus id>/information``. The whole step under systemd, at
boot and after a reboot: tests/packaging/test_deb_gpu.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.driverstandin import build, compiler

from lokid.unit import gpunodes

INFORMATION = ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 180\n"
               "GPU UUID: \t GPU-5f0c0000-1111-2222-3333-444400000000\n"
               "Bus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\n"
               "GPU Excluded:\t No\n")


def listing(top: Path, minors: dict[str, int]) -> Path:
    gpus = top / "gpus"
    for bus, minor in minors.items():
        (gpus / f"0000:{bus}:00.0").mkdir(parents=True)
        (gpus / f"0000:{bus}:00.0" / "information").write_text(
            INFORMATION.format(bus=bus, minor=minor))
    return gpus


def test_the_minors_are_the_drivers_own_not_the_order_of_the_listing(tmp_path: Path) -> None:
    gpus = listing(tmp_path, {"17": 2, "3b": 0, "5e": 1})
    (gpus / "0000:99:00.0").mkdir()     # a GPU whose file cannot be read: skipped
    assert gpunodes.minors(str(gpus)) == [0, 1, 2]
    assert gpunodes.minors(str(tmp_path / "absent")) == []   # the driver not loaded


def test_the_calls_are_the_control_node_each_gpu_then_unified_memory() -> None:
    assert gpunodes.calls([0, 3]) == [["-c=255"], ["-c=0"], ["-c=3"], ["-u", "-c=0", "-c=1"]]
    assert gpunodes.calls([]) == [["-c=255"], ["-u", "-c=0", "-c=1"]]


@pytest.mark.skipif(compiler() is None or os.geteuid() != 0,
                    reason="needs a C compiler and root (mknod)")
def test_as_root_every_node_is_made_and_said(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    _, modprobe = build(tmp_path / "bin", devices_file=str(tmp_path / "devices"),
                        dev_dir=str(dev), modprobe_log=str(tmp_path / "log"))
    said: list[str] = []
    assert gpunodes.run(str(modprobe), str(listing(tmp_path, {"17": 0, "3b": 1})),
                        said.append, str(dev)) == 0
    assert sorted(os.listdir(dev)) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                                       "nvidia1", "nvidiactl"]
    assert os.major((dev / "nvidia1").stat().st_rdev) == 195
    assert said == [f"the NVIDIA driver lists 2 GPU(s) (minors [0, 1]); device nodes now: "
                    f"{dev}/nvidia-uvm, {dev}/nvidia-uvm-tools, {dev}/nvidia0, "
                    f"{dev}/nvidia1, {dev}/nvidiactl"]


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_a_tool_that_fails_fails_the_step_and_says_why(tmp_path: Path) -> None:
    tool = tmp_path / "nvidia-modprobe"
    tool.write_text("#!/bin/sh\necho 'FATAL: Module nvidia not found' >&2\nexit 1\n")
    tool.chmod(0o755)
    dev = tmp_path / "dev"
    dev.mkdir()
    said: list[str] = []
    assert gpunodes.run(str(tool), str(tmp_path / "none"), said.append, str(dev)) == 1
    assert said[0] == f"{tool} -c=255 exited 1: FATAL: Module nvidia not found"
    assert said[-1].startswith("the NVIDIA driver lists 0 GPU(s) (minors none)")


def test_a_host_without_the_tool_has_nothing_to_do(tmp_path: Path) -> None:
    said: list[str] = []
    assert gpunodes.run(str(tmp_path / "absent"), say=said.append) == 0
    assert said == [f"{tmp_path}/absent is not installed: no NVIDIA driver's nodes to make"]
