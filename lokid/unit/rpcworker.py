"""What ``loki-rpc@.service`` runs: ``lokid rpc-worker <name>`` (issue 30, item 2). It
reads ``rpc/<name>.toml`` (:mod:`lokid.core.fleet.worker`), finds ``ggml-rpc-server``
(its ``server``, else beside lokid.toml's engine: the same llama.cpp build, so the same
RPC protocol), says the command line in the journal and replaces itself with it: no
interpreter stays beside the worker (``Type=exec``: systemd follows the server itself).
A config it cannot use is one line and exit 78, which the unit does not restart.
"""

from __future__ import annotations

import os
import shutil

from ..core.config.presetname import valid_preset_name
from ..core.errors import ConfigError

RPC_DIR = "rpc"


def worker_names(config_dir: str) -> list[str]:
    """The RPC workers of this host (``rpc/<name>.toml``), sorted; [] without the
    directory. OSError when it cannot be listed."""
    try:
        files = os.listdir(os.path.join(config_dir, RPC_DIR))
    except FileNotFoundError:
        return []
    return sorted(f[:-5] for f in files if f.endswith(".toml"))


def worker_command(config_dir: str, name: str) -> list[str]:
    """The worker's argv; ConfigError saying what is wrong."""
    from ..core.config.files import load_global
    from ..core.config.tomlread import read_text
    from ..core.fleet.worker import RPC_SERVER, parse_worker, worker_argv

    if not valid_preset_name(name):
        raise ConfigError(f"{name!r} is not a worker name (letters, digits, '-', '_', '.')")
    path = os.path.join(config_dir, RPC_DIR, f"{name}.toml")
    worker = parse_worker(read_text(path), path, name)
    server = worker.server
    if not server:
        engine = load_global(config_dir).engine
        found = engine if os.path.isabs(engine) else shutil.which(engine)
        if not found:
            raise ConfigError(f"cannot find {RPC_SERVER}: lokid.toml's engine {engine!r} is "
                              "not on PATH; set server = \"/path/to/ggml-rpc-server\"", path)
        server = os.path.join(os.path.dirname(os.path.realpath(found)), RPC_SERVER)
    if not os.access(server, os.X_OK):
        raise ConfigError(f"{server} is not there or not executable: the engine must be "
                          "built with GGML_RPC=ON (llama.cpp's RPC backend), or set server",
                          path, None, "server")
    return worker_argv(worker, server)


def run_worker(config_dir: str, name: str) -> int:
    """Exec the worker (returns only when that fails)."""
    import shlex

    from ..core.errors import LokiError
    from ..core.launch.crashloop import EXIT_CONFIG
    from ..host.journallog import journal_log

    try:
        argv = worker_command(config_dir, name)
    except LokiError as e:   # 78: the unit does not restart what cannot start as it is
        journal_log("", str(e), priority=3)
        return EXIT_CONFIG
    journal_log("", f"RPC worker {name}: {shlex.join(argv)}")
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        journal_log("", f"RPC worker {name}: cannot run {argv[0]}: {e.strerror}", priority=3)
    return EXIT_CONFIG
