"""lokid.gateway.replicas.compute_of: where the scaling rule finds an engine of a preset
computes, from what the daemon announces (``Memory``, ``Devices``, ``RunningArgv``;
issue 47, rule 2b of lokid.core.serve.scaling)."""

from __future__ import annotations

from lokid.core.serve.scaling import Compute
from lokid.gateway.presets import Preset
from lokid.gateway.replicas import compute_of

GIB = 1 << 30
TWO_GPUS = [{"device": "host", "total": 64 * GIB}, {"device": "GPU0", "total": 80 * GIB},
            {"device": "GPU1", "total": 80 * GIB}]


def test_a_gpu_preset_computes_on_its_gpus() -> None:
    auto = Preset("a", memory={"needs": {"host": GIB}, "per_gpu": 9 * GIB, "gpu_count": 1})
    assert compute_of(auto, TWO_GPUS, 32) == Compute(gpus=1, host_gpus=2)
    named = Preset("n", memory={"needs": {"host": GIB, "GPU1": 9 * GIB}})
    assert compute_of(named, TWO_GPUS, 32) == Compute(fixed=("GPU1",))
    # a GPU host's preset whose need is not known yet: not known (the start goes on)
    assert compute_of(Preset("x"), TWO_GPUS, 32) == Compute()


def test_a_cpu_preset_computes_on_its_threads_of_the_hosts_cores() -> None:
    host_only = {"needs": {"host": 2 * GIB}}
    cpu = Preset("c", memory=host_only, argv=("llama-server", "-m", "m.gguf", "-t", "4"))
    assert compute_of(cpu, TWO_GPUS, 32) == Compute(threads=4, cores=32)
    # the running engine's command line first: the next start's may differ
    ran = Preset("c", memory=host_only, argv=("llama-server", "-t", "4"),
                 running_argv=("llama-server", "--threads=2"))
    assert compute_of(ran, [], 8).threads == 2
    # no -t (or -t -1): the engine's default, every core
    assert compute_of(Preset("d", argv=("llama-server", "-t", "-1")), [], 8) == \
        Compute(threads=0, cores=8)
    assert compute_of(Preset("d", argv=("llama-server",)), [], 8) == Compute(cores=8)
