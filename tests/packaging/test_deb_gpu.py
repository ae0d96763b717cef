"""The Debian package on a GPU host, as far as a machine without a GPU allows (issue 44,
items 1 and 2): the driver stood in for at its own boundary, everything else real.

In a booted Debian 13 container, apt installs lokid's .deb, Debian's own
python3-pynvml (contrib) and a stand-in for the driver's packages
(tests/support/driverstandin.py): ``libnvidia-ml.so.1`` where Debian's driver puts it,
failing as the real library does when the caller may not open the device nodes, and a
setuid-root ``nvidia-modprobe`` that makes the nodes (major 195, with no driver behind
them) only when it really runs as root. The driver's ``/proc/driver/nvidia/gpus``
listing, which a container cannot fake under the kernel's own /proc, is given to
loki-gpu-nodes.service by a drop-in (LOKI_NVIDIA_GPUS_DIR). The real units' sandboxes
decide what each process sees:

- the nodes exist at boot, made as root by loki-gpu-nodes.service, and again after a
  reboot (the container's /dev starts empty of them, as a real host's does); the
  engines' own sandbox could not have made them (NoNewPrivileges= defeats the setuid);
- the daemon reads both GPUs through NVML (``Devices``, ``lokictl devices``), its device
  policy refusing every other node; a preset that fits a GPU and not the host's RAM is
  placed on the GPU, starts, and prestart's choice agrees with the daemon's figures;
- a host without the driver's nodes says so in words.

The engine is the real CPU build of b11434, in a copy beside which an empty
``libggml-cuda.so`` makes lokid count it as a GPU engine (lokid reads an engine's
backends from the library files beside it): it runs on the CPU, and the GPU figures are
the stand-in driver's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.debgpu import (
    BUS,
    ENGINE,
    MANAGER,
    MIB,
    MODEL_DIR,
    MODPROBE_LOG,
    SUITE,
    boot,
    devices,
    driver_deb,
    nodes,
    wait_devices,
)
from support.debpkg import Build, cached_build
from support.driverstandin import Gpu, compiler
from support.enginekit import free_port
from support.models import write_llama
from support.systemd_harness import Container

from lokid.core.names import preset_object_path

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(compiler() is None, reason="needs a C compiler (cc)")]

# Two GPUs of 24,000 MiB, 300 of them the driver's own; GPU1 has another user's 5,000.
GPUS = [Gpu(0, total=24000, reserved=300, name="NVIDIA L4"),
        Gpu(1, total=24000, reserved=300, used=5000, processes=((999999, 5000),),
            name="NVIDIA L4")]


@dataclass
class Host:
    ct: Container
    build: Build


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, models: Any) -> Iterator[Host]:
    b = cached_build(SUITE, tmp_path_factory.mktemp(f"deb-{SUITE}"))
    assert b.rc == 0, b.log[-4000:]
    deb = driver_deb(tmp_path_factory.mktemp("driver"))
    # ~100 MB of weights: on a GPU the host keeps ~32 MiB of it, on the host ~164
    big = write_llama(tmp_path_factory.mktemp("big") / "big.gguf", n_layers=6, n_embd=512,
                      n_head=8, n_head_kv=8, n_ff=2048)
    ct = boot(b, deb, GPUS, {"llama.gguf": Path(models.llama), "big.gguf": big})
    try:
        yield Host(ct, b)
    finally:
        ct.stop()


def test_the_nodes_are_made_at_install_as_root_by_loki_gpu_nodes(host: Host) -> None:
    ct = host.ct
    assert ct.systemctl("is-active", "loki-gpu-nodes.service").stdout.strip() == "active"
    assert nodes(ct) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    log = ct.read_file(MODPROBE_LOG).splitlines()
    assert log == ["euid=0 -c=255", "euid=0 -c=0", "euid=0 -c=1", "euid=0 -u -c=0 -c=1"], log
    said = ct.journal("loki-gpu-nodes.service")
    assert "the NVIDIA driver lists 2 GPU(s) (minors [0, 1])" in said, said


def test_the_engines_sandbox_could_not_have_made_them(host: Host) -> None:
    """Why the step exists: as loki with NoNewPrivileges= (the engine's unit), the setuid
    helper runs as loki and makes nothing; without NoNewPrivileges= it would be root."""
    ct = host.ct
    run = ["systemd-run", "--wait", "--pipe", "--quiet", "-p", "User=loki"]
    refused = ct.run([*run, "-p", "NoNewPrivileges=yes", "/usr/bin/nvidia-modprobe", "-c=7"],
                     check=False)
    assert refused.returncode != 0 and "not root" in refused.stderr + refused.stdout, refused
    assert "nvidia7" not in nodes(ct)
    engine = ct.run(["systemctl", "show", "-P", "NoNewPrivileges", "loki-engine@x.service"])
    assert engine.stdout.strip() == "yes"


def test_the_daemon_reads_both_gpus_through_the_driver(host: Host) -> None:
    ct = host.ct
    ct.write_file("/etc/loki/lokid.toml",
                  f'engine = "{ENGINE}/llama-server"\nmodel_dirs = ["{MODEL_DIR}"]\n')
    ct.write_file("/etc/loki/presets/g.toml", 'model = "llama.gguf"\nctx = 2048\n'
                  f"port = {free_port()}\n")
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service")
    seen = wait_devices(ct, {"GPU0", "GPU1"})
    assert {"GPU0", "GPU1", "host"} <= set(seen), seen
    for name in ("GPU0", "GPU1"):
        assert seen[name]["total"] == (24000 - 300) * MIB, seen[name]
        assert seen[name]["name"] == "NVIDIA L4"
        assert seen[name]["source"].startswith("the NVIDIA driver (NVML)"), seen[name]
    assert seen["GPU0"]["others"] == 0           # the driver's reserve is no one's
    assert seen["GPU1"]["others"] == 5000 * MIB  # another user's process
    out = ct.run(["lokictl", "devices"]).stdout
    assert re.search(r"GPU0 \(NVIDIA L4\)", out) and "GPU1" in out, out


def test_the_daemons_device_policy_refuses_every_other_node(host: Host) -> None:
    """The daemon reaches the GPU nodes (ENXIO: allowed, no driver behind the stand-in
    node) and nothing else (EPERM from its device policy)."""
    ct = host.ct
    ct.run(["mknod", "-m", "0666", "/dev/lokid-test-misc", "c", "10", "200"])
    probe = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p, 'r+b')\n"
             "    except OSError as e:\n        print(p, e.errno)\n")
    cgroup = ct.show("lokid.service", "ControlGroup")["ControlGroup"]
    r = ct.run(["sh", "-c", f'echo $$ > "/sys/fs/cgroup{cgroup}/cgroup.procs" && '
                f'exec python3 -c "$0" /dev/nvidiactl /dev/nvidia1 /dev/nvidia-uvm '
                f'/dev/lokid-test-misc', probe])
    errs = dict(line.split() for line in r.stdout.splitlines())
    # ENXIO 6 (allowed), EPERM 1 (refused). nvidia-uvm is allowed by its name in
    # /proc/devices (its major is the kernel's choice), which only a loaded driver
    # registers: none did here, so it is refused, as the nodes allowed by number are not
    assert errs == {"/dev/nvidiactl": "6", "/dev/nvidia1": "6", "/dev/nvidia-uvm": "1",
                    "/dev/lokid-test-misc": "1"}, r.stdout
    said = ct.run(["journalctl", "-b", "-u", "lokid.service", "--no-pager", "-q"]).stdout
    assert "Traceback" not in said, said[-3000:]


def test_a_preset_that_fits_a_gpu_and_not_the_hosts_ram_is_placed_and_starts(host: Host
                                                                             ) -> None:
    ct = host.ct
    port = free_port()
    # 140 MiB of host memory for lokid's engines: the model needs ~164 MiB on the host
    # alone (refused, when the daemon saw no GPU), ~32 MiB beside a GPU holding the rest
    ct.write_file("/etc/loki/lokid.toml",
                  f'engine = "{ENGINE}/llama-server"\nmodel_dirs = ["{MODEL_DIR}"]\n'
                  '[placement]\nhost_memory = "140M"\n')
    ct.write_file("/etc/loki/presets/big.toml", 'model = "big.gguf"\nctx = 2048\n'
                  f'gpus = "auto"\nport = {port}\n')
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service")
    wait_devices(ct, {"GPU0", "GPU1"})
    out = ct.run(["busctl", "--json=short", "get-property", BUS, preset_object_path("big"),
                  "org.lokid.Lokid1.Preset", "Memory"]).stdout
    memory = {k: v["data"] for k, v in json.loads(out)["data"].items()}
    assert "does_not_fit" not in memory, memory
    assert "GPU" in memory["text"], memory
    r = ct.run(["busctl", "call", BUS, "/org/lokid/Lokid1", MANAGER, "StartForRequest", "s",
                "big"], check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    ct.wait_for("loki-engine@big.service", "active", timeout=120)
    plan = json.loads(ct.read_file("/run/loki/big.json"))
    # prestart chose by the same figures as the daemon's: the best fit, the GPU with the
    # least room that holds it (GPU1, where another process holds 5,000 MiB)
    seen = devices(ct)
    fits = sorted((row["free"], name) for name, row in seen.items()
                  if name.startswith("GPU") and row["free"] >= 140 * MIB)
    assert fits and fits[0][1] == "GPU1", seen
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "1", plan["env"]
    assert plan["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", plan["env"]
    ct.systemctl("stop", "loki-engine@big.service")


def test_after_a_reboot_the_nodes_are_made_again_before_the_daemon(host: Host) -> None:
    ct = host.ct
    ct.reboot()
    assert ct.systemctl("is-active", "loki-gpu-nodes.service").stdout.strip() == "active"
    assert nodes(ct) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    assert all(line.startswith("euid=0 ")
               for line in ct.read_file(MODPROBE_LOG).splitlines())
    seen = wait_devices(ct, {"GPU0", "GPU1"})
    assert {"GPU0", "GPU1"} <= set(seen), seen
    after = ct.run(["systemctl", "show", "-P", "ActiveEnterTimestampMonotonic",
                    "loki-gpu-nodes.service", "lokid.service"]).stdout.split()
    assert int(after[0]) <= int(after[1]), after   # the nodes first, then the daemon


def test_a_host_without_the_drivers_nodes_says_so_in_words(host: Host) -> None:
    ct = host.ct
    ct.run(["sh", "-c", "rm -f /dev/nvidia*"])
    ct.systemctl("restart", "lokid.service")
    # the daemon reads its devices after it answers (a loaded CI machine read none yet)
    seen = wait_devices(ct, {"host"})
    assert set(seen) == {"host"}, seen
    out = ct.run(["lokid", "plan", "g"]).stdout
    assert "(NVML: Driver Not Loaded): no NVIDIA driver is loaded" in out, out
    # a GPU host whose driver is down has unknown GPUs, not none: a preset pinned to GPU1
    # is not refused "which this host does not have" (it would start, and be said to run
    # on the CPU)
    ct.write_file("/etc/loki/presets/pinned.toml", 'model = "big.gguf"\nctx = 2048\n'
                  f"gpus = [1]\nport = {free_port()}\n")
    r = ct.run(["lokid", "plan", "pinned"], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the GPUs are unknown, not absent" in r.stdout, r.stdout
    assert "does not have" not in r.stdout + r.stderr
