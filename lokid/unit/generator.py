"""A systemd generator: per-preset drop-ins for ``loki-engine@<preset>.service``.

Some settings must be applied by systemd itself, before lokid runs: the GPU
selection environment (``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
one numbering with NVML's: :mod:`lokid.core.launch.gpuselect`), a start timeout scaled to the
model's size, a Description naming the model, and the preset's secrets as credentials
(``LoadCredential=``, :mod:`lokid.core.config.secrets`). A generator (rather than files lokid writes
into /run/systemd/system) is systemd's own mechanism for configuration
derived from other files: it runs at boot and on every ``systemctl
daemon-reload``, so editing a preset and reloading refreshes the drop-in,
needs no lokid daemon running, and ``systemctl cat loki-engine@<preset>``
shows the result. Generated files go to the "normal" generator directory,
below /etc/systemd/system, so an administrator's own drop-ins still win.

Generators run early and must never fail a boot: a broken preset is skipped
with a message, and no model header is read (only the file size, when the
file is reachable; model disks may not be mounted yet). A preset on the port
of another that holds it (:func:`lokid.core.launch.conflicts.port_conflicts`: the
one that started on it last, from the runtime plans, else the first by name)
gets a message, and both their drop-ins as usual.

It also writes one drop-in for ``lokid.service``: the daemon's sandbox lets it
reach loopback only (``IPAddressDeny=any``), and its benchmark talks HTTP to
the engines; a preset bound to another address of this host (a LAN address)
is reached there, so that address, and only it, is added to the daemon's
``IPAddressAllow=`` (systemd applies it to the running daemon at the reload).
A wildcard (``0.0.0.0``, ``::``) is reached on loopback; a host *name* is not
resolved here (a generator must not wait on DNS): such a preset is reported,
and ``lokid bench`` measures it.

And the gateway's (:func:`gateway_units`): lokid.toml's ``[gateway] listen`` becomes
``ListenStream=`` lines of ``loki-gateway.socket``, which a ``sockets.target.wants/``
link of the generator's own enables (systemd's way to enable a unit from config,
as systemd-fstab-generator does for mounts): with listen unset no drop-in, no link,
nothing listens. ``api_keys_file`` becomes ``LoadCredential=`` of
``loki-gateway.service``: systemd reads the file as root, and the gateway's own user
reads its private copy only; so does each preset's ``api_key_file`` the gateway sends
upstream (an external preset's key, or a keyed engine's own: credential
``preset-key.<preset>``). An external preset gets no engine drop-in: nothing runs here.

And an on-demand preset's port (:func:`port_units`, :mod:`lokid.core.launch.portunit`): the
preset's host:port becomes the ``ListenStream=`` of an instance of the shipped template
``loki-port@.socket`` (a drop-in: a template cannot say each instance's address), enabled
by a ``sockets.target.wants/`` link; ``loki-port@.service`` (the template as shipped,
nothing generated: its ``%i`` says all) relays it to the engine's UNIX socket with
``systemd-socket-proxyd``. Templates rather than whole generated units, so that
``systemctl cat loki-port@<preset>.socket`` shows the shipped, commented unit and the one
line lokid adds. The engine's own drop-in gets the mark :data:`lokid.core.launch.portunit.HELD_ENV`
(its start then listens on the socket) and ``Wants=`` its socket (a start by hand opens
the port too, as boot does). A preset whose port another preset holds, or whose host is a
name, gets no port unit.

Each replica of a preset past the first (``[serve] max_replicas``,
:mod:`lokid.core.serve.replicas`) gets the preset's drop-in under its own instance,
``loki-engine@<preset>:<k>.service``, without the on-demand port's lines: the held port
is replica 1's.

And the engine template's journal filter (:func:`journal_dropin`,
:mod:`lokid.core.telemetry.journalfilter`): a drop-in of ``loki-engine@.service`` itself (every
instance reads it) with ``LogFilterPatterns=``, written only where the running systemd is 253
or later (:mod:`lokid.unit.systemdversion`, ``systemctl --version``): the static unit cannot
carry the key, since systemd 252 (Debian 12) logs "Unknown key" for each of its lines at
every load of every instance (issue 45, item 9).

Installed as ``/usr/lib/systemd/system-generators/lokid-engine-generator``,
which runs ``lokid generate NORMAL EARLY LATE``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ..core.config import files as cfg
from ..core.config.external import ip_host, key_credential
from ..core.config.secrets import API_KEY_TARGET, credential_id
from ..core.errors import ConfigError, printable
from ..core.fleet.peers import peer_key_credential
from ..core.fleet.worker import worker_dropin
from ..core.launch.conflicts import port_conflicts
from ..core.launch.gpuselect import visible_env
from ..core.launch.portunit import (
    HELD_ENV,
    extra_host_note,
    held_by_systemd,
    name_note,
    port_socket,
)
from ..core.names import engine_unit
from ..core.serve.replicas import replica_preset
from ..core.serve.tables import KEYS_CREDENTIAL, GatewayConfig, split_listen
from ..core.telemetry.journalfilter import DROPIN_NAME as JOURNAL_DROPIN
from ..core.telemetry.journalfilter import filter_dropin

DROPIN_NAME = "50-lokid-preset.conf"
DAEMON_UNIT = "lokid.service"
DAEMON_DROPIN = "50-lokid-engine-addresses.conf"
BASE_START_TIMEOUT = 120        # seconds for a model of unknown or tiny size
START_SECONDS_PER_GIB = 20      # a slow disk reads ~50 MiB/s; the engine then extends
MAX_START_TIMEOUT = 3600
GATEWAY_SOCKET = "loki-gateway.socket"
GATEWAY_SERVICE = "loki-gateway.service"
GATEWAY_DROPIN = "50-lokid-gateway.conf"
# Where the package installs the unit; systemd reads a .wants/ link by its name.
GATEWAY_SOCKET_PATH = "/usr/lib/systemd/system/" + GATEWAY_SOCKET
PORT_DROPIN = "50-lokid-port.conf"
ENGINE_TEMPLATE = engine_unit("")   # loki-engine@.service: its drop-ins reach every instance
PORT_SOCKET_TEMPLATE_PATH = "/usr/lib/systemd/system/loki-port@.socket"


def start_timeout(model_bytes: int | None) -> int:
    if not model_bytes:
        return BASE_START_TIMEOUT
    gib = model_bytes / 2**30
    return min(MAX_START_TIMEOUT, BASE_START_TIMEOUT + int(gib * START_SECONDS_PER_GIB))


def _quote(value: str) -> str:
    """A value for Environment="…" (systemd quoting: backslash and double quote escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def dropin(preset: cfg.Preset, model_dirs: tuple[str, ...]) -> str:
    """The drop-in text for one valid preset."""
    path = cfg.resolve_file(preset.model, model_dirs)
    size = None
    if path is not None:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = None
    # printable only: a newline here would end the line and start a directive of its own
    model = "".join(c if c.isprintable() else "?" for c in os.path.basename(path or preset.model))
    lines = [
        f"# Generated by lokid from {preset.path}; edit the preset, then",
        "# `systemctl daemon-reload`. Your own drop-ins in /etc/systemd/system win.",
        "[Unit]",
        f"Description=lokid engine {preset.name}: {model}".replace("%", "%%"),
        "",
        "[Service]",
        f"TimeoutStartSec={start_timeout(size)}",
    ]
    if preset.gpus is not None:
        # with CUDA_DEVICE_ORDER=PCI_BUS_ID (unless the preset's env orders them): CUDA
        # then numbers the GPUs as NVML and lokid do (lokid.core.launch.gpuselect). A Vulkan
        # engine's --device is the plan's: a generator does not probe engines.
        for name, value in visible_env(preset.gpus, preset.env).items():
            lines.append(f"Environment={_quote(name + '=' + value)}")
    # Secrets as credentials (lokid.core.config.secrets): systemd reads each file as root at each
    # start and hands the unit a private copy; its value never enters a unit setting.
    # (The config refuses paths that LoadCredential= would not take as written.)
    if preset.api_key_file is not None:
        lines.append(f"LoadCredential={credential_id(API_KEY_TARGET)}:{preset.api_key_file}")
    for var, source in sorted(preset.secrets.items()):
        lines.append(f"LoadCredential={credential_id(var)}:{source}")
    return "\n".join(lines) + "\n"


def _warn(message: str) -> None:
    """A warning where a generator's output goes: systemd runs generators with
    stdout/stderr on /dev/null (and $SYSTEMD_SCOPE set, since v251), so they log
    to the kernel log, which the journal reads. By hand, or without /dev/kmsg (a
    container), stderr."""
    # printable: a file name that is not UTF-8 (a lone surrogate here) or holds a
    # newline must neither fail the write nor forge a line
    line = printable(f"lokid-generator: {message}")
    if os.environ.get("SYSTEMD_SCOPE"):
        try:
            with open("/dev/kmsg", "w", encoding="utf-8") as kmsg:
                kmsg.write(f"<4>{line}\n")  # <4>: warning
            return
        except OSError:
            pass
    print(line, file=sys.stderr)


def generate(config_dir: str, out_dir: str) -> list[str]:
    """Write one drop-in per valid preset; return the units written (the engine
    template's journal filter, :func:`journal_dropin`, is not listed: a template is no
    unit)."""
    try:
        glob = cfg.load_global(config_dir)
    except ConfigError as e:
        _warn(str(e))
        glob = cfg.GlobalConfig()
    try:
        presets, broken = cfg.load_presets(config_dir)
    except ConfigError as e:  # the directory itself: nothing to generate, say why
        _warn(str(e))
        presets, broken = {}, {}
    # presets that cannot be read take nothing from the gateway but their keys
    try:
        gateway = gateway_units(glob.gateway, out_dir, gateway_keys(presets))
    except OSError as e:
        _warn(f"the gateway's units: cannot write them ({e})")
        gateway = []
    for name, error in sorted(broken.items()):
        _warn(f"skipping preset {name}: {error}")
    held = held_ports(glob, presets)
    written = []
    for name, preset in sorted(list(presets.items())):
        if preset.external is not None:   # an API elsewhere: no engine, no unit
            continue
        unit = engine_unit(name)
        try:
            _write_dropin(out_dir, unit, dropin(preset, glob.model_dirs)
                          + port_dropin(name, name in held))
            # each replica's unit its own (lokid.core.serve.replicas): the same GPUs, timeout and
            # credentials, its own name; its port is planned by its own start
            replicas = [replica_preset(preset, glob, k)
                        for k in range(2, preset.serve.max_replicas + 1)]
            for replica in replicas:
                _write_dropin(out_dir, engine_unit(replica.name),
                              dropin(replica, glob.model_dirs))
        except Exception as e:  # one preset never costs the others their drop-ins
            _warn(f"skipping preset {name}: {preset.path}: cannot write its drop-in "
                  f"({type(e).__name__}: {e})")
            del presets[name]
            continue
        written.append(unit)
        written += [engine_unit(replica.name) for replica in replicas]
    from .systemdversion import running_version

    try:
        journal_dropin(out_dir, running_version())
    except OSError as e:
        _warn(f"the engines' journal filter: cannot write its drop-in ({e})")
    # Both drop-ins are written all the same: the prestart of the one that does not hold
    # the port refuses it, naming the holder.
    from ..core.paths import runtime_dir
    from ..planning.gather import last_starts, listeners

    found = listeners(glob, presets)
    for name, clash in sorted(port_conflicts(found, last_starts(runtime_dir(), found)).items()):
        _warn(f"preset {name}: {found[name].path}: {clash}")
    hosts = {name: ep.host for name, ep in found.items()}
    # external APIs at an address: the daemon checks they answer (Reachable)
    hosts.update({name: host for name, p in presets.items()
                  if p.external and (host := ip_host(p.external.url))})
    allowed = _daemon_dropin(out_dir, hosts)
    if allowed:
        written.append(DAEMON_UNIT)
    try:
        ports = port_units({n: held[n] for n in presets if n in held},
                           {n: presets[n].path for n in presets}, out_dir)
    except OSError as e:
        _warn(f"the on-demand ports' units: cannot write them ({e})")
        ports = []
    return written + ports + gateway + rpc_units(config_dir, out_dir)


def _write_dropin(out_dir: str, unit: str, text: str) -> None:
    directory = os.path.join(out_dir, unit + ".d")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, DROPIN_NAME), "w", encoding="utf-8") as f:
        f.write(text)


def journal_dropin(out_dir: str, version: int | None) -> bool:
    """Write the engine template's journal filter for a systemd of ``version`` (None:
    unknown) where it knows the key (:func:`lokid.core.telemetry.journalfilter.filter_dropin`);
    whether it was written."""
    text = filter_dropin(version)
    if not text:
        return False
    directory = os.path.join(out_dir, ENGINE_TEMPLATE + ".d")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, JOURNAL_DROPIN), "w", encoding="utf-8") as f:
        f.write(text)
    return True


def rpc_units(config_dir: str, out_dir: str) -> list[str]:
    """A drop-in for ``loki-rpc@<name>.service`` per ``rpc/<name>.toml`` (the RPC workers
    of this host, :mod:`lokid.core.fleet.worker`): who may connect. One that cannot be
    read is said and skipped; its unit then refuses to start (lokid rpc-worker)."""
    from ..core.config.presetname import valid_preset_name
    from ..core.config.tomlread import read_text
    from ..core.fleet.worker import parse_worker
    from .rpcworker import RPC_DIR, worker_names

    directory = os.path.join(config_dir, RPC_DIR)
    try:
        names = worker_names(config_dir)
    except OSError as e:
        _warn(f"{directory}: cannot list the RPC workers ({e.strerror})")
        return []
    written = []
    for name in names:
        path = os.path.join(directory, f"{name}.toml")
        unit = f"loki-rpc@{name}.service"
        try:
            if not valid_preset_name(name):
                raise ConfigError(f"{name!r} is not a worker name", path)
            text = worker_dropin(parse_worker(read_text(path), path, name))
            os.makedirs(os.path.join(out_dir, unit + ".d"), exist_ok=True)
            with open(os.path.join(out_dir, unit + ".d", DROPIN_NAME), "w",
                      encoding="utf-8") as f:
                f.write(text)
        except (ConfigError, OSError) as e:
            _warn(f"skipping RPC worker {name}: {e}")
            continue
        written.append(unit)
    return written


def gateway_keys(presets: Mapping[str, cfg.Preset]) -> dict[str, str]:
    """Each preset's key file the gateway sends with its requests, by preset: an external
    API's key, or a keyed engine's own (lokid.core.config.external). A file missing now is left
    out with a message: a LoadCredential= that cannot be read fails the whole gateway's
    start, and the gateway then says this one preset's key is missing."""
    keys = {}
    for name, preset in sorted(presets.items()):
        path = preset.external.api_key_file if preset.external else preset.api_key_file
        if not path:
            continue
        if not os.path.exists(path):
            _warn(f"preset {name}: {preset.path}: api_key_file {path} does not exist: the "
                  "gateway gets no key for it")
            continue
        keys[name] = path
    return keys


def gateway_dropins(gateway: GatewayConfig,
                    keys: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The texts of the socket's and the service's drop-ins ("" for none: the gateway is
    off, or it has no keys file and no preset key); ``keys``: :func:`gateway_keys`."""
    if not gateway.listen:
        return "", ""
    head = ("# Generated by lokid from lokid.toml [gateway]; edit it, then\n"
            "# `systemctl daemon-reload`. Your own drop-ins in /etc/systemd/system win.\n")
    listen = []
    for text in gateway.listen:   # already checked by the config: IP address and port
        host, port = split_listen(text)
        listen.append(f"ListenStream={f'[{host}]' if ':' in host else host}:{port}\n")
    socket = head + "[Socket]\n" + "".join(listen)
    credentials = []
    if gateway.api_keys_file:
        credentials.append(f"LoadCredential={KEYS_CREDENTIAL}:{gateway.api_keys_file}\n")
    # the presets' keys (paths the config checked as LoadCredential= reads them)
    credentials += [f"LoadCredential={key_credential(name)}:{path}\n"
                    for name, path in sorted((keys or {}).items())]
    # the keys this gateway presents to its peers (lokid.core.fleet.peers); a missing file
    # is left out as a preset's is: the gateway then says that peer's key is missing
    for peer in gateway.peers:
        if not peer.api_key_file:
            continue
        if not os.path.exists(peer.api_key_file):
            _warn(f"[gateway] peer {peer.name}: api_key_file {peer.api_key_file} does not "
                  "exist: the gateway gets no key for it")
            continue
        credentials.append(f"LoadCredential={peer_key_credential(peer.name)}:"
                           f"{peer.api_key_file}\n")
    service = head + "[Service]\n" + "".join(credentials) if credentials else ""
    return socket, service


def gateway_units(gateway: GatewayConfig, out_dir: str,
                  keys: Mapping[str, str] | None = None) -> list[str]:
    """Write the gateway's drop-ins and enable its socket when listen is set; the units
    written."""
    socket, service = gateway_dropins(gateway, keys)
    written = []
    for unit, text in ((GATEWAY_SOCKET, socket), (GATEWAY_SERVICE, service)):
        if not text:
            continue
        directory = os.path.join(out_dir, unit + ".d")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, GATEWAY_DROPIN), "w", encoding="utf-8") as f:
            f.write(text)
        written.append(unit)
    if socket:
        wants = os.path.join(out_dir, "sockets.target.wants")
        os.makedirs(wants, exist_ok=True)
        link = os.path.join(wants, GATEWAY_SOCKET)
        if not os.path.islink(link):
            os.symlink(GATEWAY_SOCKET_PATH, link)
    return written


def engine_addresses(hosts: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The addresses the daemon must be allowed to reach the engines at (beyond
    loopback), and the presets it cannot reach with why."""
    import ipaddress

    allow: set[str] = set()
    unreachable = {}
    for name, host in sorted(hosts.items()):
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            if host != "localhost":
                unreachable[name] = (f"host {host!r} is a name: the daemon's benchmark reaches "
                                     "engines at addresses only (bind the preset to one, or "
                                     "use `lokid bench`)")
            continue
        if not (address.is_loopback or address.is_unspecified):
            allow.add(str(address))
    return sorted(allow), unreachable


def _daemon_dropin(out_dir: str, hosts: dict[str, str]) -> list[str]:
    allow, unreachable = engine_addresses(hosts)
    for name, why in unreachable.items():
        _warn(f"preset {name}: {why}")
    if not allow:
        return []
    directory = os.path.join(out_dir, DAEMON_UNIT + ".d")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, DAEMON_DROPIN), "w", encoding="utf-8") as f:
        f.write("# Generated by lokid: the addresses its presets bind to, so that the daemon's\n"
                "# benchmark reaches their engines (its sandbox allows loopback only).\n"
                "[Service]\n" + "".join(f"IPAddressAllow={a}\n" for a in allow))
    return allow


def held_ports(glob: cfg.GlobalConfig, presets: dict[str, cfg.Preset],
               quiet: bool = False) -> dict[str, str]:
    """``ListenStream=`` of each preset whose port systemd holds
    (:func:`lokid.core.launch.portunit.held_by_systemd`), leaving out one whose port another
    preset holds (two sockets cannot listen on one port; its start is refused anyway),
    and saying why an on-demand preset gets none (``quiet``: not; the daemon aligning
    the sockets after a reload, :mod:`lokid.runners.portsockets`, where the generator
    has said it)."""
    from ..core.launch.conflicts import listen_address
    from ..core.launch.flags import flag_value
    from ..core.paths import runtime_dir
    from ..planning.gather import last_starts, listeners

    found = listeners(glob, presets)
    clashes = port_conflicts(found, last_starts(runtime_dir(), found))
    out = {}
    for name, preset in sorted(presets.items()):
        if not preset.serve.on_demand or preset.external is not None or name in clashes:
            continue
        host, port = listen_address(preset, glob)
        listen = held_by_systemd(preset, host, port)
        if listen is None:
            if quiet:
                continue
            has_host = flag_value(preset.extra_args, "--host") is not None
            _warn(f"preset {name}: {preset.path}: "
                  f"{extra_host_note() if has_host else name_note(host)}")
            continue
        out[name] = listen
    return out


def port_dropin(name: str, held: bool) -> str:
    """What the engine unit's drop-in adds for a port systemd holds ("" for none): the
    mark its start plans by, and its socket pulled in and ordered first."""
    if not held:
        return ""
    socket = port_socket(name)
    return ("\n# On demand: systemd holds the preset's port (" + socket + "), the engine\n"
            "# listens on its UNIX socket; a start by hand opens the port too.\n"
            f"[Unit]\nWants={socket}\nAfter={socket}\n\n"
            f"[Service]\nEnvironment={_quote(HELD_ENV + '=' + socket)}\n")


def port_units(held: dict[str, str], paths: dict[str, str], out_dir: str) -> list[str]:
    """Write each held port's socket drop-in (``ListenStream=``, from ``held``: preset →
    address) and enable it with a ``sockets.target.wants/`` link; the units written.
    ``paths``: each preset's file, named in the drop-in."""
    written = []
    for name, listen in sorted(held.items()):
        unit = port_socket(name)
        directory = os.path.join(out_dir, unit + ".d")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, PORT_DROPIN), "w", encoding="utf-8") as f:
            f.write(f"# Generated by lokid from {paths.get(name, name)} (serve.on_demand);\n"
                    "# edit the preset, then `systemctl daemon-reload`.\n"
                    f"[Socket]\nListenStream={listen}\n")
        wants = os.path.join(out_dir, "sockets.target.wants")
        os.makedirs(wants, exist_ok=True)
        link = os.path.join(wants, unit)
        if not os.path.islink(link):
            os.symlink(PORT_SOCKET_TEMPLATE_PATH, link)
        written.append(unit)
    return written
