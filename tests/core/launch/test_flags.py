"""lokid.core.launch.flags: one answer per placement flag, the same for the planner and the
benchmark.

The table pins, for a 32-block model (``-ngl`` counts 33 layers), whether the
placement is set by hand (``--fit`` then leaves it alone) and whether weights
stay in RAM. The planner (:func:`lokid.core.launch.spec.plan_spec`, through a preset's
``extra_args``) and the benchmark (:func:`lokid.core.bench.rules.plan_facts`,
through the command line it measures) must give that answer; before they
shared this module they contradicted each other on ``--n-cpu-moe 0`` and
``-ngl 10``.
"""

from __future__ import annotations

import pytest
from support.engine_data import B11434
from support.headers import MTP, PLAIN

from lokid.core.bench import rules as benchrules
from lokid.core.config.files import SpecConfig
from lokid.core.launch import flags
from lokid.core.launch.spec import SpecInputs, plan_spec
from lokid.core.model.modelinfo import ModelInfo

TABLE = [
    # extra args                               by hand            weights on CPU
    (["--n-cpu-moe", "0"],                     "--n-cpu-moe",     ""),
    (["--n-cpu-moe", "4"],                     "--n-cpu-moe",     "--n-cpu-moe 4"),
    (["-ncmoe=4"],                             "--n-cpu-moe",     "--n-cpu-moe 4"),
    (["--n-cpu-ffn", "2"],                     "--n-cpu-ffn",     "--n-cpu-ffn 2"),
    (["-ngl", "10"],                           "-ngl",            "-ngl 10 of 33"),
    (["-ngl", "99"],                           "-ngl",            ""),
    (["-ngl", "33"],                           "-ngl",            ""),
    (["-ngl", "all"],                          "-ngl",            ""),
    (["-ngl", "auto"],                         "",                ""),
    (["-ngl", "0"],                            "-ngl",            "-ngl 0 of 33"),
    (["-ot", r"blk\.1[0-9]\.ffn_.*_exps=CPU"], "-ot",             "-ot"),
    (["--override-tensor", "exps=CUDA1"],      "-ot",             ""),
    (["--cpu-moe"],                            "--cpu-moe",       "--cpu-moe"),
    (["-ts", "3,1"],                           "-ts",             ""),
    (["-sm", "row"],                           "-sm row",         ""),
    (["--split-mode=layer"],                   "",                ""),
    (["-dev", "none"],                         "--device",        "-dev none"),
    (["--device", "CUDA0"],                    "--device",        ""),
    (["--fit", "off"],                         "--fit off",       ""),
    ([],                                       "",                ""),
]


@pytest.mark.parametrize(("args", "by_hand", "on_cpu"), TABLE)
def test_placement_has_one_answer_per_flag(args: list[str], by_hand: str, on_cpu: str) -> None:
    assert flags.placement(args, {}, block_count=32) == flags.Placement(by_hand, on_cpu)


def spec_notes(extra: list[str], mode: str = "ngram", model: ModelInfo = PLAIN) -> str:
    inputs = SpecInputs(spec=SpecConfig(mode=mode), extra_args=extra, arg_env={},
                        model=model, draft=None, caps=B11434, gpu_layers=None,
                        ctx=8192, mmproj=False, offload_min_batch=None)
    return "\n".join(plan_spec(inputs).notes)


@pytest.mark.parametrize(("args", "by_hand", "on_cpu"), TABLE)
def test_the_planner_and_the_benchmark_agree(args: list[str], by_hand: str,
                                             on_cpu: str) -> None:
    # The benchmark reads the command line it measures.
    argv = ["llama-server", "-m", "/m/plain.gguf", "--port", "8080", *args]
    assert benchrules.plan_facts(argv, {}, block_count=32).cpu_placed == bool(on_cpu)
    # The planner says so in its notes: n-gram refuses weights on CPU without a raised
    # offload batch, naming the reason; automatic MTP refuses placement by hand.
    notes = spec_notes(args)
    assert ("weights on CPU" in notes) == bool(on_cpu), notes
    assert not on_cpu or f"weights on CPU ({on_cpu})" in notes
    notes = spec_notes(args, mode="auto", model=MTP)
    assert ("manual placement" in notes) == bool(by_hand), notes
    assert not by_hand or f"manual placement ({by_hand})" in notes


def test_the_preset_gpu_layers_setting_is_an_ngl_named_as_the_preset_says() -> None:
    assert flags.placement([], {}, 32, gpu_layers="10") == flags.Placement(
        "gpu_layers = 10", "-ngl 10 of 33")
    # an -ngl in extra_args comes after it on the command line, and wins
    assert flags.placement(["-ngl", "all"], {}, 32, gpu_layers="10") == flags.Placement(
        "-ngl", "")


def test_the_environment_counts_and_a_flag_beats_it() -> None:
    assert flags.placement([], {"LLAMA_ARG_N_CPU_MOE": "4"}, 32).on_cpu == "--n-cpu-moe 4"
    assert flags.placement([], {"LLAMA_ARG_N_CPU_MOE": " "}, 32) == flags.Placement("", "")
    assert flags.placement(["--n-cpu-moe", "0"], {"LLAMA_ARG_N_CPU_MOE": "4"}, 32).on_cpu == ""
    assert flags.placement([], {"LLAMA_ARG_N_GPU_LAYERS": "8"}, 32).on_cpu == "-ngl 8 of 33"


def test_without_the_block_count_only_zero_layers_is_known_to_be_on_cpu() -> None:
    assert flags.placement(["-ngl", "10"], {}).on_cpu == ""
    assert flags.placement(["-ngl", "0"], {}).on_cpu == "-ngl 0"


def test_last_occurrence_wins_in_both_spellings() -> None:
    assert flags.setting(["-ub", "256", "--ubatch-size=1024"], {}, flags.UBATCH) == "1024"
    assert flags.setting([], {"LLAMA_ARG_UBATCH": "128"}, flags.UBATCH) == "128"
    assert flags.setting(["--cpu-moe"], {}, flags.CPU_MOE) is not None
