#!/usr/bin/python
"""The lokid_file module of the lokid.fleet collection (issue 30, item 3)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lokid_file
short_description: Write lokid.toml, a preset or an RPC worker's config, checked by lokid first
description:
  - Renders I(settings) as TOML and writes it where lokid reads it
    (C(lokid.toml), C(presets/NAME.toml) or C(rpc/NAME.toml) under I(config_dir)).
  - Before anything is written, the candidate is checked by lokid's own rules and
    planner, C(lokid check), in a copy of the config directory: a preset lokid would
    refuse (a misspelt key, a model that is not there, a flag the engine does not
    know) fails the task and nothing changes.
  - Supports check mode and diff mode; the check's output (the engine's command line)
    is returned as C(plan).
options:
  kind:
    description: Which file.
    choices: [global, preset, rpc]
    required: true
    type: str
  name:
    description: The preset's or the RPC worker's name (not for C(global)).
    type: str
  settings:
    description: The file's content as a mapping (tables as nested mappings).
    type: dict
    default: {}
  state:
    description: C(absent) removes the preset's or worker's file.
    choices: [present, absent]
    default: present
    type: str
  with_global:
    description:
      - lokid.toml's settings to check the candidate with, when they change in the same
        run (a preset whose model is in a new model_dirs). Not written by this task.
    type: dict
  check_only:
    description: Check the candidate and report what would change; write nothing.
    type: bool
    default: false
  config_dir:
    description: lokid's config directory.
    type: path
    default: /etc/loki
  lokid:
    description: The lokid command.
    type: path
    default: /usr/bin/lokid
"""

import os
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

HEADER = "# Written by Ansible (lokid.fleet): edit the inventory, not this file.\n"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def render(settings):
    import tomlkit  # python3-tomlkit: a dependency of the lokid package

    return HEADER + tomlkit.dumps(settings)


def relative(kind, name):
    if kind == "global":
        return "lokid.toml"
    return os.path.join("presets" if kind == "preset" else "rpc", name + ".toml")


def copy_config(config_dir, dest):
    """lokid.toml, the presets and the RPC workers' files: what lokid check reads."""
    for rel in ("lokid.toml",):
        if os.path.isfile(os.path.join(config_dir, rel)):
            shutil.copy(os.path.join(config_dir, rel), os.path.join(dest, rel))
    for sub in ("presets", "rpc"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
        here = os.path.join(config_dir, sub)
        if os.path.isdir(here):
            for f in os.listdir(here):
                if f.endswith(".toml") and os.path.isfile(os.path.join(here, f)):
                    shutil.copy(os.path.join(here, f), os.path.join(dest, sub, f))


def run_check(module, lokid, config_dir, kind, name):
    argv = [lokid, "--config-dir", config_dir, "check"]
    if kind == "preset":
        argv += ["--preset", name]
    elif kind == "rpc":
        argv += ["--rpc", name]
    rc, out, err = module.run_command(argv)
    return rc, out.strip(), err.strip()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kind=dict(type="str", required=True, choices=["global", "preset", "rpc"]),
            name=dict(type="str"),
            settings=dict(type="dict", default={}),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            with_global=dict(type="dict"),
            check_only=dict(type="bool", default=False),
            config_dir=dict(type="path", default="/etc/loki"),
            lokid=dict(type="path", default="/usr/bin/lokid"),
        ),
        required_if=[("kind", "preset", ["name"]), ("kind", "rpc", ["name"])],
        supports_check_mode=True,
    )
    p = module.params
    kind, name, config_dir = p["kind"], p["name"] or "", p["config_dir"]
    if kind != "global" and not NAME.fullmatch(name):
        module.fail_json(msg=f"{name!r} is not a {kind} name: letters, digits, '.', '_', '-'")
    path = os.path.join(config_dir, relative(kind, name))
    before = ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            before = f.read()
    dry = module.check_mode or p["check_only"]
    if p["state"] == "absent":
        if kind == "global":
            module.fail_json(msg="lokid.toml is not removed: give it settings instead")
        changed = os.path.exists(path)
        if changed and not dry:
            os.unlink(path)
        module.exit_json(changed=changed, path=path,
                         diff={"before": before, "after": "", "before_header": path,
                               "after_header": path})
    try:
        after = render(p["settings"])
    except Exception as e:   # a value TOML cannot hold (a null, a set)
        module.fail_json(msg=f"{relative(kind, name)}: cannot be written as TOML: {e}")
    with tempfile.TemporaryDirectory(prefix="lokid-candidate-") as tmp:
        copy_config(config_dir, tmp)
        if p["with_global"] is not None and kind != "global":
            with open(os.path.join(tmp, "lokid.toml"), "w", encoding="utf-8") as f:
                f.write(render(p["with_global"]))
        candidate = os.path.join(tmp, relative(kind, name))
        with open(candidate, "w", encoding="utf-8") as f:
            f.write(after)
        rc, out, err = run_check(module, p["lokid"], tmp, kind, name)
    shown = (out + ("\n" + err if err else "")).replace(tmp, config_dir)
    if rc != 0:
        module.fail_json(msg=f"lokid refuses {relative(kind, name)}: {shown}", plan=shown)
    changed = before != after
    if changed and not dry:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lokid-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(after)
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, path)
    module.exit_json(changed=changed, path=path, plan=shown,
                     diff={"before": before, "after": after, "before_header": path,
                           "after_header": path})


if __name__ == "__main__":
    main()
