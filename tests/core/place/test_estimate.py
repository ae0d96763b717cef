"""lokid.core.place.estimate: the footprint estimate, against the engine's own buffer lines.

Two kinds of checks: table tests of the arithmetic (partial offload, quantised KV,
several GPUs, the split), with figures from the CUDA log of b11434 in
/work/shared/recipes/engine-logs (a 9-block f16 GLM, n_embd 4096, -c 8192); and
three generated models run once each by the real llama-server b11434 (CPU build),
whose ``model/KV/compute buffer size`` lines the estimate must meet: model within 5 %,
KV within 1 %, compute between 0.9× and 1.5× the engine's (it is a fitted formula:
erring high costs some room, erring low a failed start, so the bound is lopsided).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from support import models as gen
from support.enginekit import engine_binary, free_port, running

from lokid.core.model.modelinfo import ModelInfo, probe_model
from lokid.core.place.estimate import estimate, layer_devices, row_bytes

MiB = 2**20

# The GLM of b11434-cuda-h200-mid_auto.log, from its print_info lines: 8 layers + 1
# NextN block, n_embd 4096, 32 heads, 8 KV heads of 128, n_ff 12288, 259 tokens,
# token_embd f32 (CPU_Mapped 4.05 MiB), 3200.41 MiB on CUDA0 (blocks + output).
GLM = ModelInfo(
    path="/m/glm.gguf", file_size=3_360_000_000, arch="glm4moe", name="mid",
    block_count=9, context_length=4096, nextn_predict_layers=1, has_nextn_tensor=True,
    hybrid=False, tensor_count=0, n_embd=4096, n_ff=12288, n_vocab=259, head_count=32,
    head_count_kv=8, key_length=128, value_length=128,
    weight_bytes=9 * 355 * MiB + 259 * 4096 * 4 + int(5.41 * MiB),
    block_bytes=(int(355 * MiB),) * 9, token_embd_bytes=259 * 4096 * 4,
    output_bytes=int(5.41 * MiB), output_tied=False,
    max_block_tensor_bytes=192 * MiB,
)


def test_kv_matches_the_cuda_log() -> None:
    # "CUDA0 KV buffer size = 256.00 MiB (8192 cells, 8 layers)": the NextN block has none.
    e = estimate(GLM, 8192, n_parallel=4)
    assert e.gpus[0].kv == 256 * MiB and e.host.kv == 0
    assert e.offloaded == e.layers == 10         # "offloaded 10/10 layers to GPU"


def test_compute_near_the_cuda_log() -> None:
    # Engine: CUDA0 compute 112.01 MiB, CUDA_Host compute 40.02 MiB.
    e = estimate(GLM, 8192, n_parallel=4)
    assert 112.01 * MiB <= e.gpus[0].compute <= 1.15 * 112.01 * MiB
    assert 40.02 * MiB * 0.95 <= e.host.compute <= 40.02 * MiB * 1.05


def test_token_embd_stays_on_the_host() -> None:
    e = estimate(GLM, 8192)
    assert e.host.model == GLM.token_embd_bytes
    assert e.gpus[0].model == 9 * 355 * MiB + GLM.output_bytes


def test_partial_offload_like_the_fit_log() -> None:
    # b11434-cuda-h200-mid_fitt_auto.log: -ngl 4 = output + blocks 6, 7, 8; KV of
    # blocks 6 and 7 on CUDA0 (64 MiB), the other 6 on the CPU (192 MiB); the GPU's
    # compute is the op-offloaded expert tensor (192.00 MiB).
    e = estimate(GLM, 8192, gpu_layers=4, n_parallel=4)
    assert (e.offloaded, e.gpus[0].kv, e.host.kv) == (4, 64 * MiB, 192 * MiB)
    assert e.gpus[0].model == 3 * 355 * MiB + GLM.output_bytes
    assert e.host.model == 6 * 355 * MiB + GLM.token_embd_bytes
    assert e.gpus[0].compute == 192 * MiB
    assert "offloaded 4/10 layers" in e.why and "KV 256 MiB (8192 × 8 layers × 8 heads" in e.why


def test_no_layer_offloaded_puts_everything_on_the_host() -> None:
    e = estimate(GLM, 8192, gpu_layers=0)
    assert e.gpus[0].model == e.gpus[0].kv == 0
    assert e.host.model == GLM.weight_bytes
    assert e.host.kv == 256 * MiB


def test_cpu_only_engine() -> None:
    e = estimate(GLM, 8192, devices=0)
    assert e.gpus == () and e.offloaded == 0
    assert e.host.kv == 256 * MiB
    assert e.total == e.host.total


@pytest.mark.parametrize(("kv_type", "per_row"), [
    ("f16", 256), ("f32", 512), ("q8_0", 136), ("q4_0", 72), ("bf16", 256)])
def test_kv_types(kv_type: str, per_row: int) -> None:
    # 128 values per row: f16 2 bytes each, q8_0 34 bytes per 32, q4_0 18 per 32.
    assert row_bytes(kv_type, 128) == per_row
    e = estimate(GLM, 1000, kv_type_k=kv_type, kv_type_v="f16", devices=0)
    assert e.host.kv == 1000 * 8 * (row_bytes(kv_type, 1024) + 2048)


def test_unknown_kv_type_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="q9_9.*q8_0"):
        estimate(GLM, 8192, kv_type_v="q9_9")


def test_per_layer_kv_heads_leave_recurrent_layers_out() -> None:
    hybrid = replace(GLM, nextn_predict_layers=0,
                     head_count_kv_per_layer=(8, 0, 0, 8, 0, 0, 8, 0, 0))
    e = estimate(hybrid, 8192, devices=0)
    assert e.host.kv == 3 * 8192 * 2 * 1024 * 2


def test_tied_output_gets_a_copy_of_token_embd_on_the_gpu() -> None:
    tied = replace(GLM, output_tied=True)
    e = estimate(tied, 8192)
    assert e.gpus[0].model == 9 * 355 * MiB + GLM.output_bytes + GLM.token_embd_bytes
    assert e.host.model == GLM.token_embd_bytes


def test_two_gpus_split_by_free_memory() -> None:
    # 3:1 free memory: of 10 layers, the first 3/4 (0..7) on GPU0, the rest (and the
    # output) on GPU1; both run layers, so both hold a compute buffer.
    e = estimate(GLM, 8192, free=[30 * 2**30, 10 * 2**30])
    assert layer_devices(9, 10, [3, 1]) == (0, 0, 0, 0, 0, 0, 0, 0, 1, 1)
    assert e.gpus[0].model == 8 * 355 * MiB
    assert e.gpus[1].model == 355 * MiB + GLM.output_bytes
    assert (e.gpus[0].kv, e.gpus[1].kv) == (256 * MiB, 0)   # block 8 is the NextN one
    assert e.gpus[0].compute > 0 and e.gpus[1].compute > 0
    assert e.gpu.total + e.host.total == e.total


@pytest.mark.parametrize(("n_blocks", "ngl", "free", "expected"), [
    (3, 4, [1, 1], (0, 0, 1, 1)),
    (3, 2, [1, 1], (None, None, 0, 1)),
    (3, 99, [0, 0], (0, 0, 1, 1)),             # nothing known free: an even split
    (3, 4, [], (None, None, None, None)),      # no GPU
    (2, 3, [1, 0, 1], (0, 0, 2)),              # a full GPU gets nothing
])
def test_layer_devices(n_blocks: int, ngl: int, free: list[int],
                       expected: tuple[int | None, ...]) -> None:
    assert layer_devices(n_blocks, ngl, free) == expected


def test_hostile_shapes_give_figures_not_exceptions() -> None:
    odd = replace(GLM, head_count=0, head_count_kv=-3, n_embd=0, block_bytes=(), block_count=0)
    e = estimate(odd, -5, gpu_layers=-1, n_parallel=0)
    assert e.total >= 0 and e.offloaded == 0


# -- against the real engine -------------------------------------------------------

SHAPES = {
    "gqa": {"n_layers": 4, "n_embd": 256, "n_head": 8, "n_head_kv": 2, "n_ff": 512},
    "wide_ffn": {"n_layers": 3, "n_embd": 128, "n_head": 4, "n_head_kv": 4, "n_ff": 2048},
    "wide_embd": {"n_layers": 2, "n_embd": 1024, "n_head": 16, "n_head_kv": 4, "n_ff": 256},
}
_BUFFER = re.compile(r"CPU(?:_Mapped)? (model|KV|compute) buffer size =\s+([0-9.]+) MiB")


def _engine_buffers(log: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for kind, mib in _BUFFER.findall(log):
        found.setdefault(kind, float(mib) * MiB)     # the first context is the main one
    return found


@pytest.mark.engine
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_estimate_meets_the_engine(tmp_path: Path, shape: str) -> None:
    model = gen.write_llama(tmp_path / "m.gguf", **SHAPES[shape])
    port = free_port()
    log = tmp_path / "engine.log"
    with running([engine_binary(), "-m", str(model), "-c", "4096", "-lv", "4",
                  "--host", "127.0.0.1", "--port", str(port)], log) as engine:
        text = engine.output()
    seqs = re.search(r"n_seq_max\s+=\s+(\d+)", text)
    assert seqs is not None, text[-2000:]
    got = _engine_buffers(text)
    assert set(got) == {"model", "KV", "compute"}, text[-2000:]
    e = estimate(probe_model(model), 4096, devices=0, n_parallel=int(seqs.group(1)))
    report = f"{shape}: estimate {e.host}, engine {got}"
    assert abs(e.host.model - got["model"]) <= 0.05 * got["model"], report
    assert abs(e.host.kv - got["KV"]) <= 0.01 * got["KV"], report
    assert 0.9 * got["compute"] <= e.host.compute <= 1.5 * got["compute"], report
