"""The model pull under real systemd, from the .deb (issue 48): ``lokictl pull`` asks the
daemon, which starts ``loki-pull-<id>.service`` through StartTransientUnit; that unit runs
``lokid pull-worker`` as loki in its sandbox and fetches from a stand-in of the Hugging
Face hub (:mod:`support.hubstand`) inside the container.

One booted Debian 13 container (the release the package is for) with lokid's .deb installed
by apt, lokid.service as the package enables it with ``HF_ENDPOINT`` set by a drop-in (as an
operator sets a mirror), ``/etc/loki/hf-token`` holding the token the stand-in asks for, and
the stand-in run as a transient unit of the container (``systemd-run``), so that the pull's
unit reaches it on the container's loopback through its own sandbox. The stand-in serves
``org/tiny``: real GGUFs of three quantisations (the Q4_K_M one a llama model that
llama-server loads) and a projector. The container shares the host's network, so this test
sets the stand-in's faults and reads its request log from outside.

What is proven, each where it could fail: the files land whole in model_dirs, owned by
loki, no ``.part`` left, progress rising on ``--json``; the unit's sandbox as systemd shows
it while it runs, its StatusText, the token reaching the hub and never ``systemctl show``,
``ps`` or the unit's journal; a cut retried and resumed; a cancel keeping the part and a
second pull resuming from it; a pull going on through a restart of the daemon (the same
worker, followed again); a reboot mid-transfer keeping the part; a corrupt byte refused
with no file left, its failed unit reset by the next pull of that name; a file already in
place not fetched again; a preset on the pulled model starting and becoming ready.

Debian 12 (systemd 252) is not a second run of the whole module (a second container, its
apt install and a reboot would double the minutes): its own small test boots a bookworm
container, installs the same .deb and runs one pull there, which is what can differ: a
pull that ends 0 there is a unit systemd 252 accepted with every property (one it did not
know would refuse the whole StartTransientUnit), started by Debian 12's dbus-fast.

What this found, fixed in the product: on Debian 12 every pull failed before its unit
existed (dbus-fast 1.84 refuses a tuple as a struct's value: lokid.core.model.pullunit now gives
lists); a pull again right after ``--cancel`` was refused as Busy until the daemon's next
read of the status file (lokid.dbus.pulls now reads it at the call, quietly: the old
pull's "stopped", signalled under the unit name the new pull reuses, ended the new
``lokictl pull`` at once); a preset whose model is a hub reference was pulled in its
engine's own process, which can write /var/lib/loki/models, with neither the daemon's
HF_ENDPOINT nor its token (lokid.unit.pullfirst now always asks the daemon under systemd).
The preset names one file (``org/tiny/tiny-F16.gguf``): a quantisation reference would
fetch the stand-in's mmproj too, a llama file that is no projector, and planned with
``--mmproj`` the engine would refuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.debpkg import TARGET, Build, cached_build, runtime_packages
from support.enginekit import engine_binary, free_port
from support.hubstand import requests_log, set_faults, start_in_container
from support.models import write_llama, write_meta, write_slow_llama
from support.systemd_harness import Container, _say, until

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ENGINE_DIR = "/opt/engine"
HUB_SCRIPT = "/opt/hubstand/hubstand.py"
HUB_ROOT = "/srv/hub"
HUB_UNIT = "loki-hubstand.service"
MODELS = "/var/lib/loki/models"
DAEMON = "lokid.service"
REPO_FILES = ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "tiny-F16.gguf", "mmproj-tiny-F16.gguf")
HERE = Path(__file__).resolve().parents[1] / "support" / "hubstand.py"


@dataclass
class Site:
    ct: Container
    hub: str            # the stand-in's base URL (the host shares the container's network)
    port: int
    token: str
    root: Path           # the stand-in's repositories on the host
    sha: dict[str, str]  # file name -> its SHA-256, as the stand-in serves it


def lokictl(ct: Container, *args: str, timeout: float = 180) -> Any:
    return ct.run(["lokictl", *args], check=False, timeout=timeout)


def apt(ct: Container, *args: str) -> None:
    r = ct.run(["apt-get", "-q", "-y", *args], check=False, timeout=900,
               env={"DEBIAN_FRONTEND": "noninteractive"})
    assert r.returncode == 0, f"apt-get {' '.join(args)}:\n{r.stdout[-4000:]}\n{r.stderr}"


def the_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The session's build of this tree (test_deb's when it ran first)."""
    b = cached_build(TARGET, tmp_path_factory.mktemp(f"deb-{TARGET}"))
    assert b.rc == 0, f"dpkg-buildpackage failed on {TARGET}:\n{b.log[-6000:]}"
    return b


def hub_files(root: Path) -> dict[str, str]:
    """The stand-in's ``org/tiny``: GGUFs llama.cpp reads, and their SHA-256."""
    repo = root / "org" / "tiny"
    repo.mkdir(parents=True)
    write_slow_llama(repo / REPO_FILES[0])            # 20 MB, the one a preset serves
    write_llama(repo / REPO_FILES[1], n_embd=256, n_ff=512, seed=1)
    write_llama(repo / REPO_FILES[2], seed=2)
    write_meta(repo / REPO_FILES[3], "clip", {"clip.has_vision_encoder": True},
               ["v.patch_embd.weight"])
    return {n: hashlib.sha256((repo / n).read_bytes()).hexdigest() for n in REPO_FILES}


def start_hub(ct: Container, port: int, token: str) -> str:
    """The stand-in as a transient unit of the container; its base URL once it answers."""
    return start_in_container(ct, HUB_SCRIPT, HUB_ROOT, port, HUB_UNIT, token)


def sandbox_ready(ct: Container) -> None:
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", DAEMON, timeout=120)
    ct.wait_for(DAEMON, "active", timeout=60)


def target(ct: Container, name: str) -> str:
    """A fresh directory owned by loki, as an operator makes one for pulls."""
    path = f"/var/lib/loki/{name}"
    ct.run(["install", "-d", "-o", "loki", "-g", "loki", "-m", "0750", path])
    return path


def listing(ct: Container, directory: str) -> dict[str, tuple[str, int]]:
    """``directory``'s files: name -> (owner, size); not the hidden ones (the worker's own
    bookkeeping beside the models, such as its manifest of what it pulled)."""
    out = ct.run(["find", directory, "-mindepth", "1", "-maxdepth", "1", "-not", "-name",
                  ".*", "-printf", "%f %u %s\\n"]).stdout
    return {n: (u, int(s)) for n, u, s in (line.split() for line in out.splitlines())}


def sha_of(ct: Container, path: str) -> str:
    return ct.run(["sha256sum", path]).stdout.split()[0]


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def pull_unit(ct: Container, reference: str, directory: str) -> str:
    r = lokictl(ct, "pull", reference, "--dir", directory, "--no-wait")
    assert r.returncode == 0, (r.stdout, r.stderr)
    return str(r.stdout.strip())


def fetching(ct: Container, unit: str) -> str:
    """Wait until ``unit`` says it fetches with some bytes in; its StatusText."""
    def said() -> str:
        text = ct.show(unit, "StatusText")["StatusText"]
        if text.startswith("fetching ") and not text.split(": ", 1)[1].startswith("0 B"):
            return text
        return ""
    text: str = until(f"{unit} fetching", said, 60)
    return text


def ended(ct: Container, unit: str) -> None:
    until(f"{unit} ended", lambda: ct.show(unit, "ActiveState")["ActiveState"]
          in ("inactive", "failed"), 120, 0.2)


def ranges(log: list[dict[str, Any]], name: str) -> list[int]:
    """The starts of the Range requests the stand-in saw for ``name``'s bytes."""
    return [int(e["range"].split("=")[1].split("-")[0]) for e in log
            if e["path"].endswith(f"/{name}") and e["path"].startswith("/_cdn/")
            and e["range"]]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    b = the_build(tmp_path_factory)
    hub_root = tmp_path_factory.mktemp("hub")
    sha = hub_files(hub_root)
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary()),
             os.path.dirname(HUB_SCRIPT): str(HERE.parent), HUB_ROOT: str(hub_root)}
    with Container(suite=TARGET, packages=runtime_packages(TARGET), binds=binds) as ct:
        apt(ct, "update")
        apt(ct, "install", f"/debs/{b.deb.name}")
        token = f"hf_{secrets.token_hex(16)}"
        port = free_port()
        ct.write_file("/etc/loki/hf-token", token + "\n", mode=0o600)
        engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
        ct.write_file("/etc/loki/lokid.toml", f"engine = {json.dumps(engine)}\n"
                      f"model_dirs = [{json.dumps(MODELS)}]\n")
        ct.write_file(f"/etc/systemd/system/{DAEMON}.d/hf.conf",
                      f"[Service]\nEnvironment=HF_ENDPOINT=http://127.0.0.1:{port}\n")
        target(ct, "models")
        sandbox_ready(ct)
        yield Site(ct, start_hub(ct, port, token), port, token, hub_root, sha)


def test_a_pull_lands_whole_in_model_dirs_owned_by_loki(site: Site) -> None:
    ct = site.ct
    set_faults(site.hub, slow=20)          # ~6 s for the 20 MB file: progress can be seen
    r = lokictl(ct, "pull", "org/tiny:Q4_K_M", "--json")
    set_faults(site.hub)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = json_lines(r.stdout)
    done = [x["done"] for x in lines if x["state"] == "fetching"]
    assert len(set(done)) >= 3, lines                  # progress, not one leap
    assert done == sorted(done), done
    assert lines[-1]["state"] == "done", lines[-1]
    _say(f"pull: {len(set(done))} progress reports of {done[-1]} bytes, then done")
    files = listing(ct, MODELS)
    assert set(files) == {"tiny-Q4_K_M.gguf", "mmproj-tiny-F16.gguf"}, files
    assert {owner for owner, _ in files.values()} == {"loki"}, files
    for name in files:
        assert sha_of(ct, f"{MODELS}/{name}") == site.sha[name], name


def test_the_units_sandbox_status_and_token_as_systemd_shows_them(site: Site) -> None:
    ct = site.ct
    d = target(ct, "sandbox")
    cursor = ct.cursor()
    set_faults(site.hub, slow=100)             # 640 KiB/s: seconds to look
    unit = pull_unit(ct, "org/tiny:Q8_0", d)
    assert unit.startswith("loki-pull-") and unit.endswith(".service"), unit
    said = fetching(ct, unit)
    assert "tiny-Q8_0.gguf" in said, said
    props = ct.show(unit, "User", "ProtectSystem", "ReadWritePaths", "CapabilityBoundingSet",
                    "RestrictAddressFamilies", "NoNewPrivileges", "MemoryMax",
                    "ProtectHome", "PrivateDevices")
    assert props["User"] == "loki", props
    assert props["ProtectSystem"] == "strict", props
    assert props["ProtectHome"] == "read-only", props
    assert props["PrivateDevices"] == "yes", props
    assert set(props["ReadWritePaths"].split()) == {d, "/run/loki/pulls"}, props
    assert props["CapabilityBoundingSet"] == "", props
    assert set(props["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6",
                                                              "AF_UNIX"}, props
    assert props["NoNewPrivileges"] == "yes", props
    assert props["MemoryMax"] == str(512 << 20), props
    status = ct.systemctl("status", "--no-pager", "--lines=0", unit, check=False).stdout
    assert "Status: \"fetching tiny-Q8_0.gguf" in status, status
    shown = ct.systemctl("show", unit).stdout
    ps = ct.run(["ps", "-eww", "-o", "user,args"]).stdout
    worker = [line for line in ps.splitlines() if "pull-worker" in line]
    assert worker and all(line.startswith("loki ") for line in worker), ps
    set_faults(site.hub)
    ended(ct, unit)
    assert set(listing(ct, d)) == {"tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf"}, listing(ct, d)
    log = requests_log(site.hub)
    api = [e for e in log if e["path"].startswith("/api/models/org/tiny/tree/")]
    assert api and all(e["auth"] for e in api), api     # the credential reached the hub
    journal = ct.journal(unit, since_cursor=cursor)
    assert site.token not in shown
    # the stand-in's own command line holds it (it is the hub); nothing of lokid's does
    assert not [line for line in ps.splitlines()
                if site.token in line and HUB_SCRIPT not in line], ps
    assert site.token not in journal
    assert site.token not in ct.journal(DAEMON, since_cursor=cursor)


def test_a_cut_is_retried_and_resumed_to_a_whole_file(site: Site) -> None:
    ct = site.ct
    d = target(ct, "cut")
    seen = len(requests_log(site.hub))
    set_faults(site.hub, cut_after=1 << 20)
    r = lokictl(ct, "pull", "org/tiny:Q4_K_M", "--dir", d)
    set_faults(site.hub)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sha_of(ct, f"{d}/tiny-Q4_K_M.gguf") == site.sha["tiny-Q4_K_M.gguf"]
    starts = ranges(requests_log(site.hub)[seen:], "tiny-Q4_K_M.gguf")
    assert starts and starts[0] > 0, starts
    _say(f"cut after 1 MiB: resumed with Range from byte {starts[0]}")
    assert not [n for n in listing(ct, d) if n.endswith(".part")], listing(ct, d)


def test_a_cancel_keeps_the_part_and_the_next_pull_resumes(site: Site) -> None:
    ct = site.ct
    d = target(ct, "cancel")
    set_faults(site.hub, slow=300)
    unit = pull_unit(ct, "org/tiny:Q4_K_M", d)
    fetching(ct, unit)
    r = lokictl(ct, "pull", "--cancel", unit)
    assert r.returncode == 0, (r.stdout, r.stderr)
    ended(ct, unit)
    set_faults(site.hub)
    files = listing(ct, d)
    assert "tiny-Q4_K_M.gguf" not in files, files
    part = files["tiny-Q4_K_M.gguf.part"][1]
    assert 0 < part < (site.root / "org" / "tiny" / "tiny-Q4_K_M.gguf").stat().st_size, files
    seen = len(requests_log(site.hub))
    r = lokictl(ct, "pull", "org/tiny:Q4_K_M", "--dir", d)
    assert r.returncode == 0, (r.stdout, r.stderr)
    starts = ranges(requests_log(site.hub)[seen:], "tiny-Q4_K_M.gguf")
    assert starts and starts[0] >= part, (starts, part)
    _say(f"cancel: a part of {part} bytes kept, resumed from byte {starts[0]}")
    assert sha_of(ct, f"{d}/tiny-Q4_K_M.gguf") == site.sha["tiny-Q4_K_M.gguf"]


def test_a_pull_goes_on_through_a_restart_of_the_daemon(site: Site) -> None:
    ct = site.ct
    d = target(ct, "restart")
    set_faults(site.hub, slow=300)
    unit = pull_unit(ct, "org/tiny:Q8_0", d)
    fetching(ct, unit)
    pid = ct.show(unit, "MainPID")["MainPID"]
    ct.systemctl("restart", DAEMON, timeout=120)
    ct.wait_for(DAEMON, "active", timeout=60)
    assert ct.show(unit, "MainPID")["MainPID"] == pid      # the same worker, not a new one

    def followed() -> list[dict[str, Any]]:
        r = lokictl(ct, "pulls", "--json")
        return [p for p in json.loads(r.stdout) if p["unit"] == unit] if r.returncode == 0 \
            else []
    (row,) = until("the restarted daemon following the pull again", followed, 30, 0.5)
    assert row["state"] in ("fetching", "waiting"), row
    set_faults(site.hub)
    ended(ct, unit)
    (row,) = until("the pull reported done", lambda: [
        p for p in followed() if p["state"] == "done"], 30, 0.5)
    assert sha_of(ct, f"{d}/tiny-Q8_0.gguf") == site.sha["tiny-Q8_0.gguf"]


def test_a_reboot_mid_transfer_keeps_the_part_and_the_pull_resumes(site: Site) -> None:
    ct = site.ct
    d = target(ct, "reboot")
    set_faults(site.hub, slow=300)
    unit = pull_unit(ct, "org/tiny:Q4_K_M", d)
    fetching(ct, unit)
    ct.reboot()
    ct.wait_for(DAEMON, "active", timeout=60)
    site.hub = start_hub(ct, site.port, site.token)     # a fresh one: no fault, no log
    part = listing(ct, d)["tiny-Q4_K_M.gguf.part"][1]
    assert part > 0
    r = lokictl(ct, "pull", "org/tiny:Q4_K_M", "--dir", d)
    assert r.returncode == 0, (r.stdout, r.stderr)
    starts = ranges(requests_log(site.hub), "tiny-Q4_K_M.gguf")
    assert starts and starts[0] >= part, (starts, part)
    _say(f"reboot: a part of {part} bytes kept, resumed from byte {starts[0]}")
    assert sha_of(ct, f"{d}/tiny-Q4_K_M.gguf") == site.sha["tiny-Q4_K_M.gguf"]


def test_a_corrupt_byte_fails_the_pull_and_leaves_nothing(site: Site) -> None:
    ct = site.ct
    d = target(ct, "corrupt")
    cursor = ct.cursor()
    set_faults(site.hub, corrupt_at=1000)
    r = lokictl(ct, "pull", "org/tiny:F16", "--dir", d)
    set_faults(site.hub)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "SHA-256" in r.stderr, r.stderr
    files = listing(ct, d)
    assert "tiny-F16.gguf" not in files and not [n for n in files if n.endswith(".part")], \
        files
    r = lokictl(ct, "pulls", "--json")
    (unit,) = [p["unit"] for p in json.loads(r.stdout) if p["directory"] == d]
    assert ct.show(unit, "ActiveState")["ActiveState"] == "failed"   # exit 78, kept loaded
    worker = ct.run(["journalctl", "-t", "lokid-pull", "--output=cat", "--no-pager",
                     f"--after-cursor={cursor}"]).stdout
    assert "Traceback" not in worker + ct.journal(DAEMON, since_cursor=cursor)
    # the failed unit of that name is reset by the next pull, which systemd then starts
    r = lokictl(ct, "pull", "org/tiny:F16", "--dir", d)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sha_of(ct, f"{d}/tiny-F16.gguf") == site.sha["tiny-F16.gguf"]


def test_a_preset_on_the_pulled_model_starts_and_becomes_ready(site: Site) -> None:
    ct = site.ct
    # the first test's pull when it ran; else this one. Pulled again, a file in place whose
    # SHA-256 is the hub's is kept as it is: no byte of it is asked for twice.
    lokictl(ct, "pull", "org/tiny:Q4_K_M")
    seen = len(requests_log(site.hub))
    r = lokictl(ct, "pull", "org/tiny:Q4_K_M")
    assert r.returncode == 0, (r.stdout, r.stderr)
    again = [e for e in requests_log(site.hub)[seen:]
             if e["path"].startswith("/_cdn/") and e["method"] == "GET"]
    assert not again, again
    port = free_port()
    r = lokictl(ct, "new", "pulled", "--model", "tiny-Q4_K_M.gguf", f"port={port}",
                "ctx=2048")
    assert r.returncode == 0, (r.stdout, r.stderr)
    ct.systemctl("start", "loki-engine@pulled.service", timeout=180)
    ct.wait_for("loki-engine@pulled.service", "active", timeout=120)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as h:
        assert h.status == 200


def test_a_preset_naming_a_hub_reference_is_pulled_by_its_start(site: Site) -> None:
    ct = site.ct
    port = free_port()
    seen = len(requests_log(site.hub))
    ct.write_file("/etc/loki/presets/byref.toml",
                  f'port = {port}\nctx = 2048\nmodel = "org/tiny/tiny-F16.gguf"\n')
    assert "tiny-F16.gguf" not in listing(ct, MODELS)
    unit = "loki-engine@byref.service"
    ct.systemctl("start", "--no-block", unit)
    try:
        def asked() -> list[dict[str, Any]]:
            return [e for e in requests_log(site.hub)[seen:] if e["path"].startswith("/api/")]
        try:
            fetched = until("the start's pull asking the mirror", asked, 30, 0.5)
        except AssertionError as e:
            said = ct.show(unit, "StatusText")["StatusText"]
            raise AssertionError(f"{e}; {unit} says: {said}") from None
        assert all(e["auth"] for e in fetched), fetched
        ct.wait_for(unit, "active", timeout=120)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as h:
            assert h.status == 200
        files = listing(ct, MODELS)
        assert files["tiny-F16.gguf"][0] == "loki", files
        assert sha_of(ct, f"{MODELS}/tiny-F16.gguf") == site.sha["tiny-F16.gguf"]
    finally:
        ct.systemctl("stop", unit, check=False, timeout=60)


def test_a_pull_runs_under_debian_12s_systemd(tmp_path_factory: pytest.TempPathFactory
                                              ) -> None:
    b = the_build(tmp_path_factory)
    hub_root = tmp_path_factory.mktemp("hub12")
    sha = hub_files(hub_root)
    binds = {"/debs": str(b.deb.parent), os.path.dirname(HUB_SCRIPT): str(HERE.parent),
             HUB_ROOT: str(hub_root)}
    with Container(suite="bookworm", packages=runtime_packages("bookworm"),
                   binds=binds) as ct:
        apt(ct, "update")
        apt(ct, "install", f"/debs/{b.deb.name}")
        version = ct.run(["systemctl", "--version"]).stdout.split()[1]
        token = f"hf_{secrets.token_hex(16)}"
        port = free_port()
        ct.write_file("/etc/loki/hf-token", token + "\n", mode=0o600)
        ct.write_file("/etc/loki/lokid.toml", f"model_dirs = [{json.dumps(MODELS)}]\n")
        ct.write_file(f"/etc/systemd/system/{DAEMON}.d/hf.conf",
                      f"[Service]\nEnvironment=HF_ENDPOINT=http://127.0.0.1:{port}\n")
        target(ct, "models")
        sandbox_ready(ct)
        hub = start_hub(ct, port, token)
        r = lokictl(ct, "pull", "org/tiny:F16", "--json")
        assert r.returncode == 0, (version, r.stdout, r.stderr, ct.journal(DAEMON)[-3000:])
        files = listing(ct, MODELS)
        assert set(files) == {"tiny-F16.gguf", "mmproj-tiny-F16.gguf"}, files
        assert {owner for owner, _ in files.values()} == {"loki"}, files
        assert sha_of(ct, f"{MODELS}/tiny-F16.gguf") == sha["tiny-F16.gguf"]
        assert all(e["auth"] for e in requests_log(hub)
                   if e["path"].startswith("/api/")), requests_log(hub)
        _say(f"a pull under systemd {version} (Debian 12): done")
