"""lokictl against the real daemon on a private real dbus-daemon."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemonproc import daemon_on_bus
from support.enginekit import free_port, write_config, write_preset

pytestmark = pytest.mark.engine


@pytest.fixture
def busy() -> Iterator[socket.socket]:
    """A port taken by something else."""
    with socket.socket() as s:
        yield s


@pytest.fixture
def daemon(tmp_path: Path, engine: str, models: Any, bus_address: str,
           busy: socket.socket) -> Iterator[str]:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "tiny", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "ngram"\n')
    write_preset(config, "broken", 'model = "llama.gguf"\nctx = "big"\n')
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    write_preset(config, "busy", f'model = "llama.gguf"\nctx = 2048\n'
                 f'port = {busy.getsockname()[1]}\n')
    with daemon_on_bus(config, tmp_path, bus_address) as address:
        yield address


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=60)


def test_status(daemon: str) -> None:
    r = lokictl(daemon, "status")
    assert r.returncode == 0, r.stderr
    assert "2 presets, 1 broken" in r.stdout and "broken broken:" in r.stdout
    data = json.loads(lokictl(daemon, "status", "--json").stdout)
    assert data["presets"] == ["busy", "tiny"] and list(data["broken"]) == ["broken"]
    assert data["active"] == []


def test_presets_and_show(daemon: str) -> None:
    r = lokictl(daemon, "presets")
    assert r.returncode == 0 and "tiny" in r.stdout and "ngram" in r.stdout, r.stderr
    assert any(line.startswith("broken ") and "ctx" in line for line in r.stdout.splitlines())
    rows = json.loads(lokictl(daemon, "presets", "--json").stdout)
    assert [row["Name"] for row in rows] == ["busy", "tiny", "broken"]
    assert [row["State"] for row in rows] == ["inactive", "inactive", "broken"]
    assert "ctx" in rows[2]["Error"]
    show = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
    assert show["Unit"] == "loki-engine@tiny.service" and "ngram-mod" in show["Argv"]


def test_plan_matches_lokid_plan_json(daemon: str, tmp_path: Path) -> None:
    r = lokictl(daemon, "plan", "tiny", "--json")
    assert r.returncode == 0, r.stderr
    over_bus = json.loads(r.stdout)
    local = json.loads(subprocess.run(
        [sys.executable, "-m", "lokid.cli", "--config-dir", str(tmp_path / "config"), "plan",
         "tiny", "--json"], capture_output=True, text=True,
        env={**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state")}).stdout)
    # the devices' free memory moves between two readings: the daemon's are in Devices
    assert local.pop("devices")[-1]["device"] == "host"
    assert over_bus == local and over_bus["memory"]["sources"] == {"host": "estimate"}


@pytest.mark.parametrize("args,code,fragment", [
    (("show", "nope"), 4, "no preset 'nope'"),
    (("plan", "broken"), 2, "ctx: must be an integer"),
    (("frobnicate",), 2, "invalid choice"),
    # --since as journalctl reads it; anything else is a usage error before any call
    (("stats", "tiny", "--since", "10 parsecs"), 2, "--since '10 parsecs': "),
    (("logs", "tiny", "-n", "0"), 2, "-n: 1 to 10000"),
])
def test_exit_codes(daemon: str, args: tuple[str, ...], code: int, fragment: str) -> None:
    r = lokictl(daemon, *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert fragment in r.stderr and "Traceback" not in r.stderr


def test_no_daemon_is_a_clear_error(bus_address: str) -> None:
    r = lokictl(bus_address, "status")
    assert r.returncode == 1 and "lokid is not running" in r.stderr, r.stderr


def test_start_restart_stop_with_wait(daemon: str) -> None:
    r = lokictl(daemon, "start", "tiny", "--wait")
    assert r.returncode == 0 and r.stdout.startswith("tiny: ready"), (r.stdout, r.stderr)
    show = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
    assert show["State"] == "ready" and show["SpecActive"] == ["ngram-mod"]
    assert show["Status"].startswith("ready: tiny (llama.gguf) at http://127.0.0.1:")
    assert json.loads(lokictl(daemon, "status", "--json").stdout)["active"] == ["tiny"]
    r = lokictl(daemon, "start", "tiny", "--wait")  # already ready: at once
    assert r.returncode == 0 and r.stdout.strip() == "tiny: ready", r.stderr
    r = lokictl(daemon, "restart", "tiny", "--wait")
    assert r.returncode == 0 and r.stdout.startswith("tiny: ready"), (r.stdout, r.stderr)
    r = lokictl(daemon, "stop", "tiny", "--wait")
    assert r.returncode == 0 and r.stdout.strip() == "tiny: inactive (stopped)", r.stderr
    r = lokictl(daemon, "stop", "tiny", "--wait")  # not running: done at once
    assert r.returncode == 0 and r.stdout.startswith("tiny: inactive"), r.stderr


def test_a_failed_start_exits_1_with_the_reason(daemon: str) -> None:
    r = lokictl(daemon, "start", "busy", "--wait")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("lokictl: busy: start failed: cannot start: port ") and \
        "already in use" in r.stderr, r.stderr
    assert "lokictl start busy` tries again" in r.stderr


def test_reload_reads_the_presets_again(daemon: str, tmp_path: Path, models: Any) -> None:
    assert lokictl(daemon, "show", "later").returncode == 4
    write_preset(tmp_path / "config", "later", f'model = "{Path(models.llama).name}"\n')
    r = lokictl(daemon, "reload")
    assert r.returncode == 0, r.stderr
    # tiny, busy and later; broken is listed with its error
    assert r.stdout.startswith("presets read again: 3 presets, 1 broken:\n"), r.stdout
    # the preset named "broken": its name, then its error, no second "broken:"
    assert "\n  broken: " in r.stdout and "ctx" in r.stdout, r.stdout
    assert "broken: broken:" not in r.stdout, r.stdout
    assert json.loads(lokictl(daemon, "show", "later", "--json").stdout)["Name"] == "later"


def test_the_daemon_follows_the_preset_files(daemon: str, tmp_path: Path, models: Any,
                                              pytestconfig: pytest.Config) -> None:
    """New, edited, broken and deleted presets are seen without any command (inotify),
    and the broken one stays listed with its error. The delays are printed."""
    presets = tmp_path / "config" / "presets"

    def wait(check: Any, what: str) -> float:
        t0 = time.monotonic()
        while not check():
            assert time.monotonic() - t0 < 2.0, f"{what}: not seen within 2 s"
            time.sleep(0.02)
        return time.monotonic() - t0

    def listed() -> dict[str, Any]:
        r = lokictl(daemon, "presets", "--json")
        assert r.returncode == 0, (r.returncode, r.stderr)
        return {row["Name"]: row for row in json.loads(r.stdout)}

    delays = {}
    write_preset(tmp_path / "config", "fresh", f'model = "{Path(models.llama).name}"\n'
                 f'ctx = 2048\nport = {free_port()}\n')
    delays["new"] = wait(lambda: "fresh" in listed(), "a new preset")
    write_preset(tmp_path / "config", "fresh", f'model = "{Path(models.llama).name}"\n'
                 f'ctx = 4096\nport = {free_port()}\n')
    delays["edited"] = wait(lambda: "4096" in " ".join(listed()["fresh"]["Argv"]), "an edit")
    (presets / "fresh.toml").write_text('model = "llama.gguf"\nctx = [\n')
    delays["broken"] = wait(lambda: listed().get("fresh", {}).get("State") == "broken",
                            "a broken edit")
    r = lokictl(daemon, "presets")
    line = next(x for x in r.stdout.splitlines() if x.startswith("fresh "))
    assert "broken" in line and "fresh.toml" in line, r.stdout
    (presets / "fresh.toml").unlink()
    delays["deleted"] = wait(lambda: "fresh" not in listed(), "a deleted preset")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\ntest_ctl: presets followed in " + ", ".join(
            f"{k} {v * 1000:.0f} ms" for k, v in delays.items()), file=sys.stderr)


def test_clear_failures(daemon: str) -> None:
    r = lokictl(daemon, "clear-failures", "tiny")
    assert r.returncode == 0 and "tiny: 0 recorded failures" in r.stdout, r.stderr
    assert lokictl(daemon, "clear-failures", "nope").returncode == 4


def test_host_reaches_the_bus_through_ssh_and_systemd_stdio_bridge(daemon: str,
                                                                   tmp_path: Path) -> None:
    # A stand-in for ssh (no sshd here): it records its arguments and runs what ssh
    # would run on the far side, the real systemd-stdio-bridge, on the test's bus.
    record = tmp_path / "ssh-argv"
    fake = tmp_path / "ssh"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, os, sys\n"
                    f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                    "os.execvp('systemd-stdio-bridge', ['systemd-stdio-bridge', "
                    f"'--bus-path={daemon}'])\n")
    fake.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "lokid.ctl", "--host", "ops@gpu-7:2222", "status",
                        "--json"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_SSH": str(fake)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["presets"] == ["busy", "tiny"]
    assert json.loads(record.read_text()) == ["-xT", "-p", "2222", "--", "ops@gpu-7",
                                              "systemd-stdio-bridge"]


def test_hosts_shows_every_host_in_one_table_and_names_the_one_not_reached(
        daemon: str, tmp_path: Path) -> None:
    """--hosts .,gpu-7,gpu-9: this host's bus, gpu-7 over (a stand-in for) ssh to the real
    systemd-stdio-bridge, and gpu-9 that ssh cannot reach: one table, a HOST column,
    gpu-9 one line saying why, exit 1."""
    fake = tmp_path / "ssh"
    fake.write_text(f"#!{sys.executable}\n"
                    "import os, sys\n"
                    "if 'gpu-9' in sys.argv:\n"
                    "    sys.stderr.write('ssh: connect to host gpu-9 port 22: '\n"
                    "                     'No route to host\\n')\n"
                    "    sys.exit(255)\n"
                    "os.execvp('systemd-stdio-bridge', ['systemd-stdio-bridge', "
                    f"'--bus-path={daemon}'])\n")
    fake.chmod(0o755)
    env = {**os.environ, "SYSTEMD_SSH": str(fake)}

    def fleet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", daemon,
                               "--hosts", ".,gpu-7,gpu-9", *args], capture_output=True,
                              text=True, timeout=60, env=env)

    r = fleet("presets")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "PRESET", "STATE"], r.stdout
    for host in (".", "gpu-7"):
        for preset, state in (("busy", "inactive"), ("tiny", "inactive"), ("broken", "broken")):
            assert any(line.split()[:3] == [host, preset, state] for line in lines), r.stdout
    gone = [line for line in lines if line.startswith("gpu-9")]
    assert len(gone) == 1 and "cannot reach lokid on gpu-9 over ssh" in gone[0], r.stdout
    assert "No route to host" in r.stderr   # ssh's own word, on the terminal
    r = fleet("top", "--json")
    assert r.returncode == 1
    rows = json.loads(r.stdout)
    assert {(row["host"], row.get("preset")) for row in rows if "unreachable" not in row} == {
        (h, p) for h in (".", "gpu-7") for p in ("busy", "tiny", "broken")}
    assert [row["host"] for row in rows if "unreachable" in row] == ["gpu-9"]
    r = subprocess.run([sys.executable, "-m", "lokid.ctl", "--hosts", "a,b", "start", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--hosts: for presets and top only" in r.stderr, r.stderr


def test_host_unreachable_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "ssh"
    fake.write_text(f"#!{sys.executable}\nimport sys\n"
                    "sys.stderr.write('ssh: connect to host gpu-7 port 22: No route to host\\n')\n"
                    "sys.exit(255)\n")
    fake.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "lokid.ctl", "--host", "gpu-7", "status"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_SSH": str(fake)})
    assert r.returncode == 1 and "No route to host" in r.stderr, r.stderr
    assert "cannot reach lokid on gpu-7 over ssh" in r.stderr and "Traceback" not in r.stderr


def test_bench_through_the_daemon_with_progress_and_the_saved_result(daemon: str,
                                                                     tmp_path: Path) -> None:
    r = lokictl(daemon, "bench", "tiny")
    assert r.returncode == 1 and "preset 'tiny' is inactive, not ready" in r.stderr, r.stderr
    assert lokictl(daemon, "start", "tiny", "--wait").returncode == 0
    try:
        r = lokictl(daemon, "bench", "tiny", "--prompt", "300", "--predict", "16")
        assert r.returncode == 0, r.stderr
        assert "  [1/2] warm-up" in r.stderr and "  [2/2] short line (300 + 16 tokens)" \
            in r.stderr
        assert r.stdout.startswith("tiny: quick benchmark at http://127.0.0.1:")
        assert "  Prefill " in r.stdout and "  Decode " in r.stdout and "engine b11434" in r.stdout
        show = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
        bench = show["LastBench"]
        assert bench["result"]["mode"] == "quick" and bench["model"] == "llama.gguf"
        assert bench["result"]["protocol"] == 2 and bench["engine"].startswith("b11434")
        r = lokictl(daemon, "bench", "tiny", "--full", "--json")
        out = json.loads(r.stdout)
        # a 2048-token context is too small for the depth phase: skipped, and saved
        assert out["result"]["depth"]["skipped"].startswith("a context of 2048 tokens")
        assert out["saved"] is True and out["not_saved_reason"] == ""

        # the preset edited since its engine started: what runs is measured, not kept
        preset = tmp_path / "config" / "presets" / "tiny.toml"
        preset.write_text(preset.read_text().replace("ctx = 2048", "ctx = 4096"))
        r = lokictl(daemon, "bench", "tiny", "--prompt", "300", "--predict", "16")
        assert r.returncode == 0, r.stderr
        changed = ("the preset's plan changed since its engine started (its command line "
                   "differs now): restart it to keep a result")
        assert r.stdout.splitlines()[-1] == f"  (not saved: {changed})", r.stdout
        out = json.loads(lokictl(daemon, "bench", "tiny", "--prompt", "300", "--predict",
                                 "16", "--json").stdout)
        assert out["saved"] is False and out["not_saved_reason"] == changed
        assert out["result"]["prompt_n"] > 0
    finally:
        lokictl(daemon, "stop", "tiny", "--wait")


def test_top_and_stats_count_what_the_engine_serves(daemon: str) -> None:
    """Requests to the real engine (local runner: its lines come through the daemon's pipe)
    appear in the preset's Stats, in `lokictl stats` and in `lokictl top`."""
    import httpx

    assert lokictl(daemon, "start", "tiny", "--wait").returncode == 0
    stats = json.loads(lokictl(daemon, "stats", "tiny", "--json").stdout)
    url = stats["url"]
    completions = 0
    for i in range(3):
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": f"Hello number {i}"}],
            "max_tokens": 8 + i, "seed": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        completions += r.json()["usage"]["completion_tokens"]
    deadline = time.monotonic() + 10
    while True:
        stats = json.loads(lokictl(daemon, "stats", "tiny", "--json").stdout)
        if stats.get("requests") == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats["requests"] == 3, stats
    assert stats["generated_tokens"] == completions, stats
    assert stats["prompt_tokens"] > 0 and stats["in_flight"] == 0, stats
    assert stats["decode_tps"]["all"] > 0 and stats["prefill_tps"]["all"] > 0, stats
    assert stats["uptime_seconds"] >= 0 and stats["invocation"], stats
    assert stats["requests_per_min"] == 3, stats
    assert stats["restarts"] == 0, stats   # the local runner's count, as NRestarts

    text = lokictl(daemon, "stats", "tiny").stdout
    assert text.startswith(f"tiny: 3 requests, {stats['prompt_tokens']} prompt tokens, "
                           f"{completions} generated"), text
    top = lokictl(daemon, "top", "--once")
    assert top.returncode == 0, top.stderr
    header, *lines = top.stdout.splitlines()
    assert header.split()[:4] == ["PRESET", "STATE", "URL", "MODEL"], header
    tiny = next(line for line in lines if line.startswith("tiny "))
    assert " ready " in tiny and url in tiny and " 3.0 " in tiny, tiny
    rows = {r["preset"]: r for r in json.loads(lokictl(daemon, "top", "--json").stdout)}
    assert rows["tiny"]["requests"] == 3 and rows["tiny"]["url"] == url, rows["tiny"]
    assert rows["busy"]["requests"] is None and rows["busy"]["state"] == "inactive"
    presets = lokictl(daemon, "presets").stdout
    assert "URL" in presets.splitlines()[0] and url in presets, presets

    # no journal under the local runner: --since says so
    r = lokictl(daemon, "stats", "tiny", "--since", "1h ago")
    assert r.returncode == 2 and "no journal" in r.stderr, r.stderr
    assert lokictl(daemon, "stop", "tiny", "--wait").returncode == 0


def wait_shown(daemon: str, name: str, check: Any, timeout: float = 5.0) -> dict[str, Any]:
    """`lokictl show NAME --json` once ``check`` holds of it (the daemon follows the files)."""
    deadline = time.monotonic() + timeout
    while True:
        r = lokictl(daemon, "show", name, "--json")
        shown = json.loads(r.stdout) if r.returncode == 0 else {}
        if shown and check(shown):
            return shown
        assert time.monotonic() < deadline, (r.stdout, r.stderr)
        time.sleep(0.05)


def test_show_tells_the_running_command_line_from_the_next_starts(daemon: str,
                                                                  tmp_path: Path) -> None:
    """An edit of a running preset waits for a restart: show says what runs, what the next
    start runs, and that a restart is pending (issue 20, item 8)."""
    path = tmp_path / "config" / "presets" / "tiny.toml"
    text = path.read_text()
    assert lokictl(daemon, "start", "tiny", "--wait").returncode == 0
    try:
        shown = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
        assert shown["RunningArgv"] == shown["Argv"] and shown["PendingRestart"] is False
        running = shown["RunningArgv"]
        path.write_text("ubatch = 256\n" + text)
        shown = wait_shown(daemon, "tiny", lambda s: "256" in s["Argv"])
        assert shown["RunningArgv"] == running and "256" not in running
        assert shown["PendingRestart"] is True
        out = lokictl(daemon, "show", "tiny").stdout.splitlines()
        assert any(line.startswith("Running: ") and "ngram-mod" in line and "256" not in line
                   for line in out), out
        assert any(line.startswith("Next start: ") and "256" in line for line in out), out
        assert "PendingRestart: yes (a restart applies the edit)" in out, out
        assert lokictl(daemon, "restart", "tiny", "--wait").returncode == 0
        shown = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
        assert shown["RunningArgv"] == shown["Argv"] and shown["PendingRestart"] is False
    finally:
        lokictl(daemon, "stop", "tiny", "--wait")
        path.write_text(text)
    shown = wait_shown(daemon, "tiny", lambda s: "256" not in s["Argv"])
    assert shown["RunningArgv"] == []
    assert "Running: -" in lokictl(daemon, "show", "tiny").stdout.splitlines()


def test_a_start_the_engine_refuses_quotes_the_engines_own_error(daemon: str, tmp_path: Path,
                                                                  models: Any) -> None:
    """--wait quotes what the engine said, not the load's progress it last reported
    ("loading …: 0 s, 15 MiB resident") (issue 20, item 9)."""
    write_preset(tmp_path / "config", "badflag", f'model = "{Path(models.llama).name}"\n'
                 f'port = {free_port()}\nextra_args = ["--no-such-flag"]\n')
    wait_shown(daemon, "badflag", lambda s: "--no-such-flag" in s["Argv"])
    try:
        r = lokictl(daemon, "start", "badflag", "--wait", "--timeout", "50")
        assert r.returncode == 1, (r.stdout, r.stderr)
        first = r.stderr.splitlines()[0]
        assert first.startswith("lokictl: badflag: start failed: "), r.stderr
        assert "error: invalid argument: --no-such-flag" in first, r.stderr
        assert "loading badflag" not in first and "resident" not in first, r.stderr
    finally:
        lokictl(daemon, "stop", "badflag", "--wait")


def test_logs_of_the_local_runners_children(daemon: str) -> None:
    """No journal under the local runner: lokictl logs shows the lines the daemon kept of
    its child's output, -n of them, and the cursor protocol gives only what is new."""
    r = lokictl(daemon, "logs", "tiny")
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
    assert lokictl(daemon, "start", "tiny", "--wait").returncode == 0
    try:
        r = lokictl(daemon, "logs", "tiny", "-n", "3")
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, (r.stdout, r.stderr)
        every = lokictl(daemon, "logs", "tiny", "-n", "10000").stdout.splitlines()
        assert any(" llama-server: " in line for line in every), every
        assert any(" lokid: ready at http://" in line for line in every), every
        assert every[-3:] == r.stdout.splitlines()
        r = lokictl(daemon, "stats", "tiny", "--since", "10min")
        assert r.returncode == 2 and "no journal" in r.stderr, r.stderr
    finally:
        lokictl(daemon, "stop", "tiny", "--wait")
