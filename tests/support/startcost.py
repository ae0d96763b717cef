"""What the start-cost benchmarks share (benchmarks/readiness.py, start_preset.py): their
arguments, and the report of a run where raw starts alternate with lokid's planning
starts and its plan-reusing starts (raw, planning, raw, reusing, …)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence

from lokid.planning.endpoint import health_status

from .bytecode import describe


def arguments(runs: int) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--max-extra-ms", type=float, default=100.0)
    ap.add_argument("--source", action="store_true",
                    help="no bytecode: every module compiled at each start")
    return ap.parse_args()


def report(args: argparse.Namespace, env: Mapping[str, str], raw_label: str,
           lokid_label: str, raw: Sequence[float], planning: Sequence[float],
           reusing: Sequence[float]) -> int:
    """Print medians, the median of paired differences and ratios; 1 when an overhead
    is above ``--max-extra-ms``."""
    def ms(xs: Sequence[float]) -> float:
        return statistics.median(xs) * 1000

    raw_p, raw_r = raw[0::2], raw[1::2]
    extra_p = statistics.median(b - a for a, b in zip(raw_p, planning, strict=True)) * 1000
    extra_r = statistics.median(b - a for a, b in zip(raw_r, reusing, strict=True)) * 1000
    width = max(len(raw_label), len(lokid_label) + 13)
    print(f"runs: {args.runs} of each, alternating, same model and argv; {describe(env)}")
    print(f"{raw_label:<{width}}: median {ms(raw):7.1f} ms (min {min(raw) * 1000:.1f})")
    for how, xs, extra, base in (("planning", planning, extra_p, raw_p),
                                 ("plan reused", reusing, extra_r, raw_r)):
        print(f"{lokid_label + ', ' + how:<{width}}: median {ms(xs):7.1f} ms "
              f"(min {min(xs) * 1000:.1f}); overhead {extra:+.1f} ms, "
              f"ratio {ms(xs) / ms(base):.2f}x")
    print(f"goal: overhead <= {args.max_extra_ms:.0f} ms (median of paired differences)")
    return 0 if max(extra_p, extra_r) <= args.max_extra_ms else 1


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL: llama-server b11434 sometimes misses a SIGTERM that
    arrives right after it first answers /health (seen here: it kept running)."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_port_free(port: int) -> None:
    while health_status("127.0.0.1", port, timeout=0.2) is not None:
        time.sleep(0.01)


def raw_start(argv: list[str], port: int) -> float:
    """The reference: ``argv`` spawned, /health polled every millisecond until 200; the
    seconds that took. The engine is stopped, and its port free, on return."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while health_status("127.0.0.1", port, timeout=1.0) != 200:
            if proc.poll() is not None:
                raise RuntimeError("llama-server exited")
            time.sleep(0.001)
        return time.perf_counter() - t0
    finally:
        stop(proc)
        wait_port_free(port)
