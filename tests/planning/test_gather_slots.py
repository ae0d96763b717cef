"""Where a GPU group member's engine saves its slots (issue 22, item 7): in the state
directory its start is given, with the real engine's probe; nowhere for ``lokid run``,
which no gateway swaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.enginekit import write_config, write_preset

from lokid.core.launch.plan import build_plan
from lokid.planning.gather import gather
from lokid.unit.planview import plan_now

GROUP = 'model = "llama.gguf"\nport = 18611\n[serve]\non_demand = true\ngroup = "gpu0"\n'


def test_the_start_plans_the_slots_in_its_state_directory(tmp_path: Path, engine: str,
                                                          models: Any) -> None:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", GROUP)
    state = tmp_path / "state"
    plan = plan_now(str(config), str(state), str(tmp_path / "run"), "alpha")
    at = plan.argv.index("--slot-save-path")
    assert plan.argv[at + 1] == f"{state}/slots/alpha/"
    assert any(n.startswith(f"serve.group = gpu0: --slot-save-path {state}/slots/alpha/")
               for n in plan.notes), plan.notes
    # lokid run: no gateway, no swap, no directory to make
    assert "--slot-save-path" not in build_plan(gather(str(config), "alpha")).argv
