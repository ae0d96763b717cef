"""``lokid check``: lokid.toml, presets and RPC workers checked by lokid's own rules and
planner without starting anything, as ``nginx -t`` checks nginx's config: what a tool
that writes the config (the Ansible collection's ``lokid_file``, an operator's script)
runs on a candidate before it replaces the real one.

Each preset asked (every one when none is named) is parsed and planned as its unit would
plan it (its model, its engine's flags, its secrets as the engine's user reads them),
without the checks of the moment (a port busy, the attempt state): a preset whose
engine runs now is checked as its next start. An external preset is parsed. Each RPC
worker asked is checked as ``lokid rpc-worker`` would run it. The first line of each
item says ``ok`` or why not; the exit status is 0 when all are ok.

Two rules make it say what a start would do (both were missed, and found by the guide's
tested examples, issue 49):
- two presets on one port: the second by name is refused, as its start would be (the
  config's own conflict, not the moment's: who started there last is not asked), where
  each alone planned fine and ``check`` said ok to a preset that could never start;
- a preset whose model is a hub reference not pulled yet is ok, said so: its start pulls
  it first. ``check`` refused it, so the Ansible collection's ``lokid_file`` (which runs
  ``check`` on a candidate) refused to deploy a preset the daemon would serve.
- a preset marked ``example = true`` (the package's example.toml, its model missing by
  design) is said to be one and not planned: it never starts, so it fails nothing. On a
  fresh install, ``check`` exited 2 for the package's own file (found walking the guide
  under systemd, issue 49).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import LokiError, ModelNotPulledError


def check(config_dir: str, presets: Sequence[str] | None = None,
          workers: Sequence[str] | None = None) -> tuple[bool, list[str]]:
    """(all ok, the lines to print)."""
    from ..core.config import files as cfg
    from ..core.config.secrets import mask_argv
    from ..core.launch.conflicts import listen_address
    from ..core.launch.plan import build_plan
    from ..planning.gather import check_listen_conflicts, check_port_conflicts, gather
    from .rpcworker import worker_command, worker_names

    lines: list[str] = []
    ok = True
    try:
        glob = cfg.load_global(config_dir)
        lines.append("lokid.toml: ok")
    except LokiError as e:
        return False, [f"lokid.toml: {e}"]
    if presets is None:
        parsed, broken = cfg.load_presets(config_dir)
        names = sorted(set(parsed) | set(broken))
    else:
        names = list(presets)
    for name in names:
        try:
            preset = cfg.load_preset(config_dir, name)
            if preset.example:
                lines.append(f"preset {name}: an example (example = true), never started: "
                             "remove that line to serve it")
                continue
            if preset.external is not None:
                lines.append(f"preset {name}: ok (an external API at {preset.external.url})")
                continue
            try:
                plan = build_plan(gather(config_dir, name, for_unit=True, preset=preset))
            except ModelNotPulledError as e:
                check_listen_conflicts(config_dir, name, *listen_address(preset, glob), glob)
                lines.append(f"preset {name}: ok: {e}")
                continue
            check_port_conflicts(config_dir, plan, glob)
            lines.append(f"preset {name}: ok: {' '.join(mask_argv(plan.argv))}")
        except LokiError as e:
            ok = False
            lines.append(f"preset {name}: {e}")
    if workers is None:
        try:
            workers = worker_names(config_dir)
        except OSError as e:
            return False, [*lines, f"rpc workers: cannot list them ({e.strerror})"]
    for name in workers:
        try:
            lines.append(f"rpc worker {name}: ok: {' '.join(worker_command(config_dir, name))}")
        except LokiError as e:
            ok = False
            lines.append(f"rpc worker {name}: {e}")
    return ok, lines
