#!/usr/bin/env python3
"""A one-shot check of lokid's GPU half on a machine with a real NVIDIA GPU (issue 44).

What the test suite cannot see, because no GPU exists where it runs (it stands in for
the driver at its own boundary: tests/support/driverstandin.py). At most ~6 minutes;
it needs no systemd as PID 1 (the units' device sandboxes are emulated with mount
namespaces and setpriv, as said below). Each check prints PASS, FAIL or SKIP with its
figures; ``--json FILE`` writes them too.

1. **NVML against nvidia-smi**: lokid's reader (lokid.host.nvml, the real pynvml)
   gives each GPU's name, UUID, total, reserve and used as ``nvidia-smi`` does.
2. **Per-process memory**: an engine started on GPU0 is found by its pid, with the
   figure ``nvidia-smi --query-compute-apps`` gives.
3. **CUDA's device order**: ``llama-server --list-devices`` with and without
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` against NVML's (PCI) order; lokid always writes
   the variable (one numbering everywhere).
4. **A real CUDA out-of-memory** (a KV cache larger than the GPU, ``--fit off``): the
   engine's lines through lokid's parsers (an ``oom`` error, the device and size).
5. **A real CPU fallback** (``CUDA_VISIBLE_DEVICES=-1``, ``-ngl 99``): lokid's rule
   says the load runs on the CPU, and why.
6. **Footprint against the estimate**: what NVML measures for the running engine
   against lokid's estimate from the GGUF header (lokid.core.place.need.size_plan).
7. **The units' device sandboxes, emulated**: a private /dev holding only the nodes
   lokid.service's ``DeviceAllow=`` lists: NVML and ``--list-devices`` answer; a /dev
   without them (the old ``PrivateDevices=yes``): "Driver Not Loaded"; an engine as an
   unprivileged user with ``no_new_privs`` and no ``/dev/nvidia-uvm``: CUDA cannot make
   it through the setuid ``nvidia-modprobe`` and falls back to the CPU (why
   loki-gpu-nodes.service exists), while without ``no_new_privs`` it can.

    python3 scripts/gpu_check.py --engine /path/to/cuda/llama-server [--json out.json]

Needs: python3 with numpy and gguf (to write the test models) and pynvml
(nvidia-ml-py or python3-pynvml); ``nvidia-smi``; a CUDA build of llama-server for
checks 2-7 (they SKIP without one); root for check 7's namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from lokid.core.place.oomline import OomReader  # noqa: E402
from lokid.core.telemetry import enginelog  # noqa: E402

MIB = 1 << 20
DEADLINE = 330.0            # seconds for the whole check
START = time.monotonic()
RESULTS: list[dict[str, Any]] = []


def say(check: str, verdict: str, text: str, **figures: Any) -> None:
    RESULTS.append({"check": check, "verdict": verdict, "text": text, **figures})
    print(f"{verdict:4} {check}: {text}", flush=True)


def left() -> float:
    return max(1.0, DEADLINE - (time.monotonic() - START))


def smi(query: str, kind: str = "gpu") -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{kind}={query}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def nvml_devices() -> tuple[list[Any], str]:
    from lokid.host.nvml import GpuMemory

    gpu = GpuMemory()
    return gpu.devices() or [], gpu.why_unknown()


# --- 1 ---------------------------------------------------------------------------------

def check_nvml() -> None:
    try:
        rows = smi("index,uuid,name,memory.total,memory.reserved,memory.used")
    except (OSError, subprocess.SubprocessError) as e:
        say("nvml", "SKIP", f"nvidia-smi did not answer: {e}")
        return
    devices, why = nvml_devices()
    if not devices:
        say("nvml", "FAIL", f"lokid's reader found no GPU: {why}")
        return
    bad = []
    for row, d in zip(rows, devices, strict=False):
        index, uuid, name, total, reserved, used = row
        figures = (int(total), int(reserved), int(used))
        ours = (d.total // MIB, d.reserved // MIB, d.used // MIB)
        if int(index) != d.index or uuid != d.uuid or name != d.name or \
                any(abs(a - b) > 2 for a, b in zip(figures, ours, strict=True)):
            bad.append(f"GPU{index}: nvidia-smi {uuid} {name} {figures} MiB, lokid "
                       f"{d.uuid} {d.name} {ours} MiB")
    if len(rows) != len(devices):
        bad.append(f"nvidia-smi lists {len(rows)} GPUs, lokid {len(devices)}")
    say("nvml", "FAIL" if bad else "PASS",
        "; ".join(bad) or f"{len(devices)} GPU(s) agree: name, UUID, total, reserve, used",
        smi=rows, lokid=[[d.index, d.uuid, d.name, d.total, d.reserved, d.used]
                         for d in devices])


# --- an engine ------------------------------------------------------------------------

class Engine:
    """One llama-server started for a check, its stderr kept."""

    def __init__(self, argv: Sequence[str], env: dict[str, str],
                 wrap: Sequence[str] = ()) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="gpu-check-", suffix=".log")
        self.proc = subprocess.Popen([*wrap, *argv], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + min(timeout, left())
        while time.monotonic() < deadline:
            if text in self.lines_text() or self.proc.poll() is not None:
                return text in self.lines_text()
            time.sleep(0.2)
        return False

    def lines_text(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.lines_text()
        self.log.close()
        return text


def engine_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "LLAMA_ARG"))}
    return {**env, **extra}


def parse(lines: str) -> tuple[enginelog.Load, list[tuple[str, int]]]:
    tracker, oom = enginelog.LoadTracker(), OomReader()
    failed = []
    for line in lines.splitlines():
        tracker.feed(line)
        found = oom.feed(line)
        if found:
            failed.append(found)
    return tracker.current or tracker.before, failed


# --- 2, 6 ------------------------------------------------------------------------------

def check_process_and_footprint(engine: str, model: Path, port: int) -> None:
    if shutil.which("nvidia-smi") is None or not nvml_devices()[0]:
        say("process", "SKIP", "no nvidia-smi, or no GPU read through NVML")
        return
    e = Engine([engine, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-c", "4096", "-ngl", "99", "-lv", "4"],
               engine_env(CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    try:
        if not e.wait_for("listening on", 90):
            say("process", "FAIL", "the engine did not start: " + e.lines_text()[-800:])
            return
        time.sleep(1.0)
        from lokid.host.nvml import GpuMemory

        ours = GpuMemory().used([e.proc.pid]) or {}
        apps = {int(r[0]): int(r[1]) for r in smi("pid,used_memory", "compute-apps")
                if r[0].isdigit() and r[1].isdigit()}
        theirs = apps.get(e.proc.pid)
        mine = ours.get("GPU0 process")
        ok = theirs is not None and mine is not None and abs(theirs - mine) <= 2
        say("process", "PASS" if ok else "FAIL",
            f"engine pid {e.proc.pid}: nvidia-smi {theirs} MiB, lokid {mine} MiB on GPU0",
            nvidia_smi=theirs, lokid=mine)
        estimate = estimate_mib(model, 4096)
        if mine and estimate:
            say("footprint", "INFO",
                f"measured {mine:.0f} MiB on GPU0 (all the process holds: CUDA context, "
                f"cuBLAS, buffers) against lokid's estimate {estimate:.0f} MiB "
                f"(ratio {mine / estimate:.2f})", measured=mine, estimate=estimate)
    finally:
        lines = e.stop()
    load, _ = parse(lines)
    say("buffers", "PASS" if load.gpu_buffers and not load.on_cpu() else "FAIL",
        f"offload {load.offload()}, GPU buffers seen {load.gpu_buffers}, "
        f"on_cpu {load.on_cpu()!r}")


def estimate_mib(model: Path, ctx: int) -> float | None:
    from lokid.core.model.modelinfo import probe_model
    from lokid.core.place.need import size_plan

    try:
        info = probe_model(model)
        devices, _ = nvml_devices()
        sizing = size_plan("check", ["llama-server", "-m", str(model), "-c", str(ctx),
                                     "-ngl", "99"], {"CUDA_VISIBLE_DEVICES": "0"}, info,
                           host_gpus=tuple(f"GPU{d.index}" for d in devices),
                           gpu_free={f"GPU{d.index}": d.free for d in devices},
                           gpu_engine=True)
    except Exception as e:  # the estimate's own API moved: said, not fatal
        say("footprint", "SKIP", f"lokid's estimate could not be made: {e}")
        return None
    on_gpu = sum(v for k, v in sizing.need.fixed.items() if k.startswith("GPU"))
    on_gpu += sizing.need.per_gpu * max(0, sizing.need.count)
    return on_gpu / MIB


# --- 3 ---------------------------------------------------------------------------------

def check_order(engine: str) -> None:
    from lokid.core.place.room import parse_devices

    orders = {}
    for label, extra in (("default", {}), ("PCI_BUS_ID", {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})):
        done = subprocess.run([engine, "--list-devices"], capture_output=True, timeout=60,
                              env=engine_env(**extra))
        orders[label] = [(d.name, d.description, d.total_bytes // MIB)
                         for d in parse_devices(done.stdout + b"\n" + done.stderr)]
    devices, why = nvml_devices()
    if not devices:
        say("order", "SKIP", f"no GPU read through NVML: {why}")
        return
    pci = [(d.name, d.total // MIB) for d in devices]
    same = [desc.split(",")[0].strip() for _, desc, _ in orders["PCI_BUS_ID"]] == \
        [name for name, _ in pci]
    note = "1 GPU: the two orders cannot differ here; " if len(devices) == 1 else ""
    say("order", "PASS" if same else "FAIL",
        f"{note}--list-devices with PCI_BUS_ID {orders['PCI_BUS_ID']}; default "
        f"{orders['default']}; NVML {pci}", orders=orders, nvml=pci)


# --- 4, 5 ------------------------------------------------------------------------------

def check_oom(engine: str, model: Path, port: int) -> None:
    devices, _ = nvml_devices()
    if not devices:
        say("oom", "SKIP", "no GPU read")
        return
    # a KV cache of ~1.2 × the GPU: n_embd 64 × 2 layers × 2 (K, V) × 2 bytes per token
    ctx = int(devices[0].total * 1.2 / (64 * 2 * 2 * 2))
    e = Engine([engine, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(ctx), "-ngl", "99", "--fit", "off", "-lv", "4"],
               engine_env(CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    e.proc.wait(min(120, left()))
    lines = e.stop()
    load, failed = parse(lines)
    ok = "oom" in load.error_kinds and any(d == "GPU0" for d, _ in failed)
    said = [line for line in lines.splitlines() if "memory" in line.lower()][:6]
    say("oom", "PASS" if ok else "FAIL",
        f"ctx {ctx}: error kinds {sorted(load.error_kinds)}, failed allocations {failed}",
        lines=said)


def check_cpu_fallback(engine: str, model: Path, port: int,
                       wrap: Sequence[str] = (), label: str = "cpu_fallback",
                       env: dict[str, str] | None = None) -> enginelog.Load:
    e = Engine([engine, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-c", "2048", "-ngl", "99", "-lv", "4"],
               env if env is not None else engine_env(CUDA_VISIBLE_DEVICES="-1"), wrap)
    e.wait_for("listening on", 60)
    lines = e.stop()
    load, _ = parse(lines)
    if label == "cpu_fallback":
        said = [line for line in lines.splitlines() if "ggml_cuda_init" in line][:2]
        say(label, "PASS" if load.on_cpu() else "FAIL",
            f"lokid says {load.on_cpu()!r}", lines=said)
    return load


# --- 7 ---------------------------------------------------------------------------------

def in_private_dev(nodes: Sequence[str], argv: Sequence[str], user: str = "",
                   no_new_privs: bool = False, dev: str = "/dev"
                   ) -> subprocess.CompletedProcess[str]:
    """``argv`` in a mount namespace whose ``dev`` holds only the standard nodes and
    ``nodes`` (copied with mknod from the host's), as a unit's private /dev would."""
    script = ["set -e", f"mount -t tmpfs -o mode=0755 tmpfs {dev}",
              f"mknod -m 666 {dev}/null c 1 3", f"mknod -m 666 {dev}/zero c 1 5",
              f"mknod -m 666 {dev}/urandom c 1 9", f"mknod -m 666 {dev}/random c 1 8"]
    for node, (major, minor) in _numbers(nodes).items():
        script.append(f"mknod -m 666 {shlex.quote(node)} c {major} {minor}")
    run = " ".join(shlex.quote(a) for a in argv)
    if user or no_new_privs:
        run = ("setpriv " + ("--no-new-privs " if no_new_privs else "")
               + (f"--reuid {user} --regid {user} --init-groups " if user else "") + run)
    script.append(f"exec {run}")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           "\n".join(script)], capture_output=True, text=True,
                          timeout=min(120, left()))


def _numbers(nodes: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Each node's (major, minor), read before the namespace hides them."""
    found = {}
    for node in nodes:
        st = os.stat(node)
        found[node] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def check_sandboxes(engine: str | None, model: Path | None, port: int,
                    dev: str = "/dev") -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        say("sandbox", "SKIP", "needs root and unshare")
        return
    nvidia = sorted(f"{dev}/{n}" for n in os.listdir(dev)
                    if n == "nvidiactl" or (n.startswith("nvidia") and n[6:].isdigit()))
    if not nvidia:
        say("sandbox", "SKIP", f"no NVIDIA device node in {dev}: no driver here")
        return
    uvm = [p for p in (f"{dev}/nvidia-uvm", f"{dev}/nvidia-uvm-tools") if os.path.exists(p)]
    child = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
             "from lokid.host.nvml import GpuMemory; g = GpuMemory(); d = g.devices(); "
             "print(len(d) if d is not None else 'none', g.why_unknown())"]
    allowed = in_private_dev(nvidia + uvm, child, dev=dev)
    hidden = in_private_dev([], child, dev=dev)
    ok = allowed.stdout.split()[:1] not in ([], ["none"], ["0"]) and \
        "Driver Not Loaded" in hidden.stdout
    say("sandbox_daemon", "PASS" if ok else "FAIL",
        f"lokid.service's nodes: {allowed.stdout.strip() or allowed.stderr[-300:]}; "
        f"none (PrivateDevices=yes): {hidden.stdout.strip() or hidden.stderr[-300:]}")
    if engine is None or model is None:
        return
    modprobe = shutil.which("nvidia-modprobe")
    if modprobe is None:
        say("sandbox_engine", "SKIP", "no nvidia-modprobe on this machine")
        return
    argv = [engine, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-ngl", "99", "-lv", "4"]
    results = {}
    for label, nnp in (("no_new_privs", True), ("setuid allowed", False)):
        done = in_private_dev(nvidia, ["timeout", "20", *argv], "nobody", nnp, dev)
        load, _ = parse(done.stdout + done.stderr)
        results[label] = load.on_cpu() or "on the GPU"
    ok = results["no_new_privs"] != "on the GPU" and results["setuid allowed"] == "on the GPU"
    say("sandbox_engine", "PASS" if ok else "FAIL",
        f"without /dev/nvidia-uvm, as nobody: {results}", results=results)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", help="a CUDA build of llama-server (checks 2-7)")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--port", type=int, default=18760)
    p.add_argument("--dev", default="/dev", help="where the device nodes are (tests)")
    args = p.parse_args(argv)
    from support.models import write_llama

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    os.chmod(work, 0o755)
    model = write_llama(work / "tiny.gguf")
    os.chmod(model, 0o644)
    bigger = write_llama(work / "bigger.gguf", n_layers=6, n_embd=512, n_head=8,
                         n_head_kv=8, n_ff=2048)
    steps: list[tuple[str, Callable[[], object]]] = [("nvml", check_nvml)]
    if args.engine:
        steps += [("process", lambda: check_process_and_footprint(args.engine, bigger,
                                                                   args.port)),
                  ("order", lambda: check_order(args.engine)),
                  ("oom", lambda: check_oom(args.engine, model, args.port + 1)),
                  ("cpu_fallback", lambda: check_cpu_fallback(args.engine, model,
                                                              args.port + 2))]
    else:
        say("engine", "SKIP", "no --engine: checks 2-6 need a CUDA build of llama-server")
    steps.append(("sandbox", lambda: check_sandboxes(args.engine, model, args.port + 3,
                                                     args.dev)))
    for name, step in steps:
        if left() <= 1.0:
            say(name, "SKIP", "out of time")
            continue
        try:
            step()
        except Exception as e:   # one check's failure never hides the others'
            say(name, "FAIL", f"{type(e).__name__}: {e}")
    shutil.rmtree(work, ignore_errors=True)
    print(f"done in {time.monotonic() - START:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    return 1 if any(r["verdict"] == "FAIL" for r in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
