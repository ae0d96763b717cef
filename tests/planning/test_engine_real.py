"""Every spec mode's plan is accepted by the real llama-server b11434: it starts and answers.

The models are the generated ones (tests/support/models.py): a tiny llama for the
plain, n-gram and draft-model cases, and a tiny GLM-4.5-style model whose MTP
head really drafts, so MTP runs for real here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.enginekit import free_port, running, write_config, write_preset

from lokid.core.launch.plan import Plan
from lokid.planning.gather import make_plan

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Repetitive text: n-gram drafting finds continuations in it.
REPEAT = "one two three four five six seven eight nine ten " * 12


def plan_for(tmp_path: Path, engine: str, models: Any, model: str, spec: str = "",
             extra: str = "") -> Plan:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "p", f'model = "{model}"\nctx = 4096\nport = {free_port()}\n'
                 f'extra_args = [{extra}]\n' + (f"[spec]\n{spec}\n" if spec else ""))
    return make_plan(str(config), "p", environ={})


def timings(reply: dict[str, Any]) -> dict[str, Any]:
    t = reply["timings"]
    assert t["prompt_n"] > 0 and t["predicted_n"] > 0
    return dict(t)


@pytest.mark.parametrize("mode", ["off", "ngram"])
def test_plain_model_plans_run(tmp_path: Path, engine: str, models: Any, mode: str) -> None:
    plan = plan_for(tmp_path, engine, models, Path(models.llama).name, f'mode = "{mode}"')
    assert plan.spec.types == (() if mode == "off" else ("ngram-mod",))
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        t = timings(eng.chat(REPEAT, max_tokens=48))
        assert ("draft_n" in t) == (mode == "ngram")


@pytest.mark.parametrize("mode,types", [
    ("auto", ("draft-mtp",)),
    ("mtp", ("draft-mtp",)),
    ("mtp+ngram", ("draft-mtp", "ngram-mod")),
])
def test_integrated_mtp_head_drafts_for_real(tmp_path: Path, engine: str, models: Any,
                                             mode: str, types: tuple[str, ...]) -> None:
    plan = plan_for(tmp_path, engine, models, models.mtp_full, f'mode = "{mode}"')
    assert plan.spec.types == types
    assert plan.spec.auto == (mode == "auto")
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        t = timings(eng.chat("Hello", max_tokens=32))
        # The generated head agrees with the trunk: its drafts are accepted.
        assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0


def test_separate_mtp_head_file(tmp_path: Path, engine: str, models: Any) -> None:
    plan = plan_for(tmp_path, engine, models, models.mtp_plain,
                    f'mode = "mtp"\ndraft = "{Path(models.mtp_head).name}"')
    assert "-md" in plan.argv and plan.spec.types == ("draft-mtp",)
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        assert timings(eng.chat("Hello", max_tokens=32))["draft_n"] > 0


def test_ordinary_draft_model(tmp_path: Path, engine: str, models: Any) -> None:
    plan = plan_for(tmp_path, engine, models, models.llama,
                    f'mode = "mtp"\ndraft = "{models.draft}"\nn_max = 4')
    assert plan.spec.types == ("draft-simple",)
    assert "--spec-draft-n-max" in plan.argv
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        assert "draft_n" in timings(eng.chat(REPEAT, max_tokens=32))


def test_mtp_plus_ngram_without_head_runs_ngram_alone(tmp_path: Path, engine: str,
                                                      models: Any) -> None:
    plan = plan_for(tmp_path, engine, models, models.llama, 'mode = "mtp+ngram"')
    assert plan.spec.types == ("ngram-mod",)
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        assert "draft_n" in timings(eng.chat(REPEAT, max_tokens=64))


def test_key_without_head_tensor_is_planned_without_mtp_and_runs(
        tmp_path: Path, engine: str, models: Any) -> None:
    plan = plan_for(tmp_path, engine, models, models.mtp_trunk, 'mode = "mtp"')
    assert plan.spec.types == () and "--spec-type" not in plan.argv
    assert any("no MTP head in this file" in n for n in plan.notes)
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        assert "draft_n" not in timings(eng.chat())


def test_what_the_tensor_rule_prevents_the_engine_aborts(tmp_path: Path, engine: str,
                                                        models: Any) -> None:
    """The same file with draft-mtp forced by hand: the engine dies (GGML_ASSERT)."""
    plan = plan_for(tmp_path, engine, models, models.mtp_trunk,
                    extra='"--spec-type", "draft-mtp"')
    log = tmp_path / "engine.log"
    with pytest.raises(AssertionError, match="did not become healthy"):
        with running(plan.argv, log, plan.env):
            pass
    assert "MTP block missing nextn.eh_proj" in log.read_text(errors="replace")


def test_extra_args_come_last_and_the_engine_accepts_them(tmp_path: Path, engine: str,
                                                          models: Any) -> None:
    plan = plan_for(tmp_path, engine, models, models.llama, 'mode = "ngram"',
                    extra='"-t", "1", "--spec-draft-sampling", "greedy"')
    assert plan.argv[-4:] == ("-t", "1", "--spec-draft-sampling", "greedy")
    assert plan.argv.count("--spec-draft-sampling") == 1
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        timings(eng.chat())
