"""lokid.planning.gather: a file this process may not read is "permission denied", never
"does not exist" (as another user, for real: a forked child that drops root)."""

from __future__ import annotations

import pwd
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import write_config, write_preset
from support.users import run_as

from lokid.core.config import files as cfg
from lokid.core.errors import LokiError
from lokid.core.launch.plan import build_plan
from lokid.planning.gather import gather


@pytest.fixture
def tree(open_tree: Path) -> Path:
    """A directory every user can walk into (conftest's open_tree)."""
    return open_tree


def as_user(user: pwd.struct_passwd, call: Callable[[], str]) -> str:
    """What ``call`` returns as ``user``; an exception as its type and message."""
    return run_as(user, call, lambda e: f"{type(e).__name__}: {e}")


def plan_error(config: Path, name: str) -> str:
    try:
        inputs = gather(str(config), name)
    except LokiError as e:
        return f"{type(e).__name__}: {e}"
    return "planned: " + "; ".join(
        [] if inputs.draft is None else [f"draft error {inputs.draft.error}"])


def test_a_model_this_user_may_not_reach_is_permission_denied(
        engine: str, models: Any, tree: Path, engine_user: pwd.struct_passwd) -> None:
    private = tree / "private"
    private.mkdir(mode=0o700)
    shutil.copy(models.llama, private / "llama.gguf")
    public = tree / "public"
    public.mkdir(mode=0o755)
    shutil.copy(models.llama, public / "llama.gguf")
    (public / "llama.gguf").chmod(0o644)
    config = write_config(tree, engine, [public, private])
    config.chmod(0o755)
    write_preset(config, "ok", 'model = "llama.gguf"\n')
    write_preset(config, "abs", f'model = "{private}/llama.gguf"\n')
    write_preset(config, "bare", 'model = "hidden"\n')
    write_preset(config, "draft", f'model = "llama.gguf"\n[spec]\nmode = "mtp"\n'
                 f'draft = "{private}/llama.gguf"\n')
    (config / "presets").chmod(0o755)
    for preset in (config / "presets").iterdir():
        preset.chmod(0o644)
    shutil.copy(models.llama, private / "hidden.gguf")
    # the parent plans once: lazy imports and the engine probe are in place for the child
    assert plan_error(config, "ok") == "planned: "

    name = engine_user.pw_name
    denied = (f"permission denied for user {name}: directory {private} (owner root:root, "
              f"mode 0700) is not searchable by it: chmod o+x {private}")
    assert as_user(engine_user, lambda: plan_error(config, "ok")) == "planned: "
    out = as_user(engine_user, lambda: plan_error(config, "abs"))
    assert out.startswith(f"ModelError: model {private}/llama.gguf: {denied}"), out
    out = as_user(engine_user, lambda: plan_error(config, "bare"))  # found in the second model_dir
    assert out.startswith(f"ModelError: model {private}/hidden: {denied}"), out
    # a draft only drops with a note
    out = as_user(engine_user, lambda: plan_error(config, "draft"))
    assert out.startswith(f"planned: draft error spec.draft {private}/llama.gguf: {denied}"), out

    private.chmod(0o755)
    (private / "llama.gguf").chmod(0o600)
    out = as_user(engine_user, lambda: plan_error(config, "abs"))
    assert out.startswith(
        f"ModelError: model {private}/llama.gguf: permission denied for user {name}: the file "
        f"(owner root:root, mode 0600) is not readable by it: chmod o+r {private}/llama.gguf"), out


def test_a_preset_given_is_planned_instead_of_its_file(engine: str, models: Any,
                                                        tree: Path) -> None:
    """An edit not yet written is planned as it would start: the text's ctx, not the file's."""
    config = write_config(tree, engine, [Path(models.llama).parent])
    path = write_preset(config, "edited", 'model = "llama.gguf"\nctx = 4096\n')
    candidate = cfg.parse_preset_text("edited", str(path), 'model = "llama.gguf"\nctx = 2048\n')

    def ctx(argv: tuple[str, ...]) -> str:
        return argv[argv.index("-c") + 1]

    assert ctx(build_plan(gather(str(config), "edited")).argv) == "4096"
    inputs = gather(str(config), "edited", preset=candidate)
    assert inputs.preset is candidate
    assert ctx(build_plan(inputs).argv) == "2048"
