"""lokid.core.place.need: a plan's need per device, from its command line.

The model is the GLM of the real b11434 CUDA log (tests/core/place/test_estimate.py: its
figures are the engine's own), so each need below is checked against what the estimate
says for the same shape, and the shape against what the engine does with its flags.
"""

from __future__ import annotations

from test_estimate import GLM

from lokid.core.place.estimate import estimate
from lokid.core.place.footprint import BUFFERS, CGROUP, ESTIMATE, NVML, Footprint
from lokid.core.place.need import ENGINE_BASE, engine_gpus, shape, size_plan
from lokid.core.place.policy import HOST, Device, never_fits

MiB, GiB = 2**20, 2**30
ARGV = ["/e/llama-server", "-m", "/m/glm.gguf", "--host", "127.0.0.1", "--port", "8080",
        "-c", "8192", "-np", "4"]


def test_the_shape_comes_from_the_last_flag_of_each_kind() -> None:
    s = shape([*ARGV, "-ctk", "q8_0", "--cache-type-v=q4_0", "-ub", "256", "-ngl", "4",
               "--ctx-size", "4096", "-fa", "off"], GLM)
    assert s == {"ctx": 4096, "gpu_layers": 4, "n_parallel": 4, "kv_type_k": "q8_0",
                 "kv_type_v": "q4_0", "ubatch": 256, "flash_attn": False, "kv_unified": True}


def test_defaults_are_the_engines() -> None:
    s = shape(["/e/llama-server", "-m", "/m/glm.gguf", "-c", "0", "-ngl", "auto"], GLM)
    # -c 0: the model's own context; -ngl auto: every layer (the most it can take)
    assert s["ctx"] == GLM.context_length == 4096 and s["gpu_layers"] is None
    assert (s["n_parallel"], s["ubatch"], s["flash_attn"]) == (4, 512, True)
    assert shape([*ARGV, "-ngl", "garbage", "-np", "-1"], GLM)["n_parallel"] == 4


def test_which_gpus_the_engine_sees() -> None:
    host = ("GPU0", "GPU1")
    assert engine_gpus({}, host, gpu_engine=False) == ((), 0)
    assert engine_gpus({}, host, gpu_engine=True) == (host, 0)
    assert engine_gpus({"CUDA_VISIBLE_DEVICES": "1"}, host, True) == (("GPU1",), 0)
    assert engine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f6a,GPU-77b1"}, host, True) == ((), 2)


def test_gpus_named_by_uuid_are_the_devices_the_driver_gave_those_uuids() -> None:
    """Issue 44, item 8: a preset pinned to a MIG instance (10 GiB of an 80 GiB card) was
    sized as "one GPU to choose", and placed by the whole card's room."""
    host = ("GPU0/MIG0", "GPU0/MIG2", "GPU1")
    uuids = {"MIG-aa": "GPU0/MIG2", "GPU-bb": "GPU1", "GPU-cc": "GPU0"}
    pinned = {"CUDA_VISIBLE_DEVICES": "MIG-aa"}
    assert engine_gpus(pinned, host, True, uuids=uuids) == (("GPU0/MIG2",), 0)
    assert engine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bb,MIG-aa"}, host, True, uuids=uuids) \
        == (("GPU1", "GPU0/MIG2"), 0)
    # a UUID the driver did not give (not read, or not this host's): to be found, as before
    assert engine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bb,GPU-dd"}, host, True, uuids=uuids) \
        == ((), 2)
    s = size_plan("glm", ARGV, pinned, GLM, host_gpus=host, gpu_engine=True,
                  gpu_uuids=uuids)
    assert set(s.need.fixed) == {"GPU0/MIG2", HOST} and s.need.count == 0
    # a footprint booked under the UUID (the engine's buffer lines) counts on that device
    fp = Footprint("k", {"MIG-aa": 3 * GiB}, {"MIG-aa": BUFFERS})
    s = size_plan("glm", ARGV, pinned, GLM, host_gpus=host, gpu_engine=True,
                  gpu_uuids=uuids, footprint=fp)
    assert s.need.fixed["GPU0/MIG2"] == 3 * GiB and s.sources["GPU0/MIG2"] == BUFFERS


def test_a_cpu_engine_needs_everything_on_the_host() -> None:
    s = size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0",), gpu_engine=False)
    e = estimate(GLM, 8192, n_parallel=4, devices=0)
    assert s.need.fixed == {HOST: e.total + ENGINE_BASE} and s.need.count == 0
    assert s.sources == {HOST: ESTIMATE} and not s.measured
    assert s.text.startswith(f"needs {(e.total + ENGINE_BASE) / GiB:.1f} GiB on host "
                             "(estimated); the estimate: offloaded 0/10 layers")
    assert s.text.endswith("; plus the engine's own 24 MiB on host")


def test_a_gpu_engine_on_one_gpu_with_a_projector() -> None:
    s = size_plan("glm", [*ARGV, "--mmproj", "/m/proj.gguf"], {"CUDA_VISIBLE_DEVICES": "0"},
                  GLM, host_gpus=("GPU0", "GPU1"), gpu_engine=True,
                  extra={"mmproj": 600 * MiB})
    e = estimate(GLM, 8192, n_parallel=4, devices=1)
    assert s.need.fixed == {"GPU0": e.gpus[0].total + 600 * MiB,
                            HOST: e.host.total + ENGINE_BASE}
    assert "plus mmproj 600 MiB" in s.text


def test_a_measured_device_replaces_the_estimate_only_there() -> None:
    e = estimate(GLM, 8192, n_parallel=4, devices=1)
    f = Footprint("k", {"GPU0": 4 * GiB, HOST: 700 * MiB}, {"GPU0": NVML, HOST: ESTIMATE})
    s = size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0",), gpu_engine=True, footprint=f,
                  cost=12.5)
    assert s.need.fixed == {"GPU0": 4 * GiB, HOST: e.host.total + ENGINE_BASE}
    assert s.sources == {"GPU0": NVML, HOST: ESTIMATE} and s.need.cost == 12.5
    assert f"4.0 GiB on GPU0 (measured by the NVIDIA driver (per process); estimated " \
           f"{e.gpus[0].total / GiB:.1f} GiB)" in s.text
    # a footprint of devices this plan does not use (another gpus) says nothing of it
    other = Footprint("k", {"GPU3": GiB, HOST: GiB}, {"GPU3": BUFFERS, HOST: CGROUP})
    s2 = size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0",), gpu_engine=True, footprint=other)
    assert s2.need.fixed["GPU0"] == e.gpus[0].total and s2.need.fixed[HOST] == GiB


def test_gpus_by_uuid_are_a_count_to_place() -> None:
    s = size_plan("glm", ARGV, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, GLM,
                  host_gpus=("GPU0", "GPU1"), gpu_engine=True)
    e = estimate(GLM, 8192, n_parallel=4, devices=2)
    assert s.need.count == 2 and s.need.per_gpu == max(p.total for p in e.gpus)
    assert set(s.need.fixed) == {HOST}


def test_gpus_auto_takes_the_fewest_gpus_that_hold_it() -> None:
    host = ("GPU0", "GPU1", "GPU2")
    one = estimate(GLM, 8192, n_parallel=4, devices=1).gpus[0].total
    two = max(p.total for p in estimate(GLM, 8192, n_parallel=4, devices=2).gpus)
    assert two < one
    big = {g: 2 * one for g in host}
    s = size_plan("glm", ARGV, {}, GLM, host_gpus=host, gpu_engine=True, gpu_choice=0,
                  gpu_capacity=big)
    assert (s.need.count, s.need.per_gpu, set(s.need.fixed)) == (1, one, {HOST})
    assert "on one GPU (estimated)" in s.text
    # no GPU holds it alone: two, each with its share
    small = {g: (one + two) // 2 for g in host}
    s2 = size_plan("glm", ARGV, {}, GLM, host_gpus=host, gpu_engine=True, gpu_choice=0,
                   gpu_capacity=small)
    assert (s2.need.count, s2.need.per_gpu) == (2, two)
    assert "on each of 2 GPUs" in s2.text
    # gpu_count: as many as it says, whatever their size; no more than the host has
    s3 = size_plan("glm", ARGV, {}, GLM, host_gpus=host, gpu_engine=True, gpu_choice=2)
    assert s3.need.count == 2
    assert size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0",), gpu_engine=True,
                     gpu_choice=2).need.count == 1
    # once its start chose (the runtime plan's CUDA_VISIBLE_DEVICES), it holds those
    s4 = size_plan("glm", ARGV, {"CUDA_VISIBLE_DEVICES": "2"}, GLM, host_gpus=host,
                   gpu_engine=True, gpu_choice=0, gpu_capacity=big)
    assert set(s4.need.fixed) == {"GPU2", HOST} and s4.need.count == 0
    # a CPU engine or a host without GPUs: nothing to choose
    assert size_plan("glm", ARGV, {}, GLM, host_gpus=(), gpu_engine=True,
                     gpu_choice=0).need.count == 0


def test_a_chosen_preset_measured_elsewhere_uses_its_measure() -> None:
    """Its footprint was measured on GPU2 at the last start: the next start, wherever
    it goes, needs that figure per GPU."""
    fp = Footprint("k", {"GPU2": 3 * GiB, HOST: GiB}, {"GPU2": NVML, HOST: CGROUP})
    s = size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0", "GPU1", "GPU2"), gpu_engine=True,
                  gpu_choice=1, footprint=fp)
    assert (s.need.count, s.need.per_gpu, s.need.fixed[HOST]) == (1, 3 * GiB, GiB)
    assert "3.0 GiB on one GPU (measured by the NVIDIA driver" in s.text


def test_the_refusal_names_the_figures() -> None:
    s = size_plan("glm", [*ARGV, "-c", "8000000"], {}, GLM, host_gpus=("GPU0",),
                  gpu_engine=True)
    h200 = [Device("GPU0", 143155 * MiB), Device(HOST, 24 * GiB, reserve=GiB)]
    why = never_fits(s.need, h200)
    assert why.startswith(f"needs {s.need.fixed['GPU0'] / GiB:.1f} GiB on GPU0; it has "
                          "139.8 GiB")
    assert never_fits(size_plan("glm", ARGV, {}, GLM, host_gpus=("GPU0",),
                                gpu_engine=True).need, h200) == ""
    # a GPU named in the preset that the host lacks
    s3 = size_plan("glm", ARGV, {"CUDA_VISIBLE_DEVICES": "3"}, GLM, host_gpus=("GPU0",),
                   gpu_engine=True)
    assert "on GPU3, which this host does not have" in never_fits(s3.need, h200)
