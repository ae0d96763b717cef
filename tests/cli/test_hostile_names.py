"""Every `lokid` command that takes a preset name refuses a hostile one the same way, first.

A name becomes file names: ``presets/<name>.toml``, ``$LOKI_RUNTIME_DIR/<name>.json``,
its failure records. ``../x`` would name files outside their directories, a name with
a NUL would raise from ``open``. Each command is run as an operator (or systemd) runs
it, in a child Python whose audit hook records every file it opens, lists, creates,
renames or removes under the test's directories: a refused name must have touched
none of them, and be refused with check_instance_name's one line (a preset's name, or
a replica's instance ``NAME:k``: the unit's steps run as ``lokid prestart NAME:2``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lokid.core.errors import ConfigError
from lokid.core.serve.replicas import check_instance_name

# Audit events that read or change a path (os.stat has none: nothing is read by it).
CHILD = r"""
import json, os, sys

root, args = sys.argv[1], json.load(sys.stdin)
touched = []

def hook(event, info):
    if event.split(".")[0] not in ("open", "os", "shutil", "sqlite3"):
        return
    for item in info:
        if isinstance(item, bytes):
            item = os.fsdecode(item)
        if isinstance(item, str) and item.startswith(root):
            touched.append(f"{event} {item}")

sys.addaudithook(hook)
from lokid.cli import main

try:
    rc = main(args)
finally:
    print(json.dumps(touched), flush=True)
sys.exit(rc)
"""

NAMES = [
    "../x", "../../etc/passwd", "a/b", "/abs", ".hidden", ".", "..", "-rf", "a" * 65,
    "a\nb", "a\x00b", "a b", "préset", "x\u202e", "",
    # a replica's instance is NAME:k, k from 2 to 16 (issue 47): none of these is one
    "x:1", "x:17", "x:02", ":2", "../x:2", "x:\uff12",
]
# The unit's helpers as systemd runs them (`lokid engine %i`: no "--" before the name);
# the operator's commands with "--", which a name beginning with "-" needs.
COMMANDS = {
    "plan": ["plan", "--"],
    "run": ["run", "--"],
    "prestart": ["prestart", "--"],
    "bench": ["bench", "--"],
    "stopped": ["stopped", "--"],
    "engine": ["engine"],
}


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, str]:
    """A config dir with a lokid.toml and a preset, and the state and runtime dirs, each
    with a file a name with ``..`` would reach."""
    config = tmp_path / "config"
    (config / "presets").mkdir(parents=True)
    (config / "lokid.toml").write_text('engine = "/nonexistent/llama-server"\n')
    (config / "presets" / "x.toml").write_text('model = "x.gguf"\n')
    (config / "x.toml").write_text('model = "x.gguf"\n')   # presets/../x.toml
    for d in ("state", "run"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.json").write_text("{}")
    return {"LOKI_CONFIG_DIR": str(config), "LOKI_STATE_DIR": str(tmp_path / "state"),
            "LOKI_RUNTIME_DIR": str(tmp_path / "run")}


def lokid(root: Path, env: dict[str, str], args: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, stderr, files touched under ``root``) of `lokid ARGS`."""
    child_env = {**os.environ, **env, "SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited",
                 "EXIT_STATUS": "1", "INVOCATION_ID": "0123456789abcdef"}
    child_env.pop("NOTIFY_SOCKET", None)
    child_env.pop("JOURNAL_STREAM", None)
    r = subprocess.run([sys.executable, "-c", CHILD, str(root)], input=json.dumps(args),
                       env=child_env, capture_output=True, text=True, timeout=60)
    touched = json.loads(r.stdout.splitlines()[-1]) if r.stdout.strip() else ["(no report)"]
    return r.returncode, r.stderr, touched


def tree(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


def refusal(name: str) -> str:
    with pytest.raises(ConfigError) as e:
        check_instance_name(name)
    return f"lokid: {e.value}\n"


def test_the_hook_sees_what_a_command_reads(tmp_path: Path, dirs: dict[str, str]) -> None:
    # the control: a valid name is read, so an empty list below means nothing was
    rc, err, touched = lokid(tmp_path, dirs, ["plan", "x"])
    assert rc == 2 and "Traceback" not in err
    assert any(t.endswith("/config/lokid.toml") for t in touched), touched


@pytest.mark.parametrize("name", NAMES, ids=ascii)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_hostile_name_is_refused_before_any_file_is_touched(
        tmp_path: Path, dirs: dict[str, str], command: str, name: str) -> None:
    before = tree(tmp_path)
    rc, err, touched = lokid(tmp_path, dirs, [*COMMANDS[command], name])
    assert err == refusal(name)     # one line, check_instance_name's, no traceback
    # `engine` is the unit's main process: 78 is final (RestartPreventExitStatus=), where
    # 2 would be restarted every 5 s for ever
    assert rc == (78 if command == "engine" else 2)
    assert touched == []
    assert tree(tmp_path) == before
