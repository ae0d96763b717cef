"""The README's ten-minute path and the guide's team page, walked as a newcomer walks them,
under real systemd in a Debian 13 container with the .deb installed by apt (issue 49).

Each file the pages write is the page's own text (README.md's here-documents, the guide's
TOML blocks naming a file, read with :mod:`support.docmd`), written where the page says;
each command run is the page's, in the page's order. What cannot be the page's is mapped,
and only that:
- the engine: the page says ``/usr/bin/llama-server``; the container has the real engine
  b11434 at /opt/engine (lokid ships none: an operator installs one);
- the hub: lokid.service gets ``HF_ENDPOINT`` (a drop-in, as an operator sets a mirror)
  pointing at the stand-in (:mod:`support.hubstand`) inside the container, which serves
  each repository the pages name (``Qwen/Qwen2.5-1.5B-Instruct-GGUF``, ``…-7B-…``) as a
  small real model under the file name the hub uses;
- the ports: the container shares the host's network, so the pages' 8000, 8081 and 8082
  become free ports of the host (the README's preset keeps the default 8080);
- the guide's ``cp`` of a model file: a small real model is put there.

The walk: apt install; the README's steps to a chat answered through the gateway (its
start pulls the model); the guide's team page (its files, ``lokid check``, a request for
its second model, started on demand, then for its re-written ``qwen``, which swaps it out
and pulls the new model); a team key, used and needed. Each step's wall time is said on
the terminal (issue 49's closing note quotes them), never asserted. A step a reader would
miss fails here with what happened, the journals and the daemon's view attached.

Its first run (issue 49) found the README's first request unanswered for 300 s while the
engine was ready: not seen again in seven runs since, with or without the fix it led to
(the Stats url of a running start is its own address: tests/dbus/test_engine_url.py);
a run alongside the full suite on this host's network is the suspect. The chat's client
timeout is kept short so that a hang fails in minutes with the diagnosis.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import REPO, docmd
from support.debpkg import TARGET, cached_build, runtime_packages
from support.enginekit import engine_binary, free_port
from support.hubstand import start_in_container
from support.models import write_llama
from support.systemd_harness import Container, _say, until

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ENGINE_DIR = "/opt/engine"
HUB_SCRIPT = "/opt/hubstand/hubstand.py"
HUB_ROOT = "/srv/hub"
TEAM_PAGE = REPO / "docs" / "guide" / "team.md"
HUB_REFERENCE = re.compile(r'model = "([\w.-]+)/([\w.-]+):(\w+)"')
HUBSTAND = REPO / "tests" / "support" / "hubstand.py"
# A request's client timeout: a small model pulled from the stand-in and loaded takes
# seconds; a hang fails in two minutes, with the journals, not CI's ninety
CHAT_TIMEOUT = 120.0


@dataclass
class Walk:
    ct: Container
    ports: dict[str, str]                       # the pages' port -> this walk's
    key: str | None = None                      # the README's team key, once made
    times: list[tuple[str, float]] = field(default_factory=list)

    def step(self, name: str, started: float) -> None:
        took = time.monotonic() - started
        self.times.append((name, took))
        _say(f"walk: {name}: {took:.1f} s")

    def mapped(self, text: str) -> str:
        text = text.replace("/usr/bin/llama-server",
                            f"{ENGINE_DIR}/{os.path.basename(engine_binary())}")
        for page, here in self.ports.items():
            text = re.sub(rf"(?<![\d.]){page}\b", here, text)
        return text

    def sh(self, line: str, timeout: float = 120) -> str:
        """One command line of a page, as a reader types it (no shell needed: the
        pages' lines used here are plain commands)."""
        argv = shlex.split(self.mapped(line))
        r = self.ct.run(argv, check=False, timeout=timeout)
        assert r.returncode == 0, f"{line!r} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return str(r.stdout)

    def chat(self, model: str, key: str | None = None,
             timeout: float = CHAT_TIMEOUT) -> tuple[int, str]:
        """A chat request to the gateway, as the README's curl sends it; (status, body)."""
        body = json.dumps({"model": model, "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Hello"}]})
        argv = ["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "--max-time",
                str(int(timeout)), f"http://127.0.0.1:{self.ports['8000']}/v1/chat/completions",
                "-H", "Content-Type: application/json", "-d", body]
        if key is not None:
            argv += ["-H", f"Authorization: Bearer {key}"]
        r = self.ct.run(argv, check=False, timeout=timeout + 10)
        text, _, code = r.stdout.rpartition("\n")
        return int(code or 0), text


    def diagnosis(self, preset: str) -> str:
        """What a reader would look at when a request hangs: the daemon's view of the
        preset, the units' states and the three journals."""
        parts = []
        for argv in (["lokictl", "show", preset, "--json"], ["lokictl", "status"],
                     ["systemctl", "--no-pager", "status", f"loki-engine@{preset}.service",
                      "loki-gateway.service", "lokid.service"]):
            r = self.ct.run(argv, check=False)
            parts.append(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}")
        for unit in ("lokid.service", f"loki-engine@{preset}.service", "loki-gateway.service"):
            parts.append(f"-- {unit}\n{self.ct.journal(unit)[-20000:]}")
        return "\n".join(parts)


def hub_files(*pages: Path) -> dict[str, tuple[str, str, str]]:
    """Each hub reference the pages' presets name (``ORG/REPO:QUANT``) → (org, repo, the
    file the hub has for it: ``Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M`` is
    ``qwen2.5-1.5b-instruct-q4_k_m.gguf``, as on huggingface.co)."""
    out = {}
    for page in pages:
        for org, repo, quant in HUB_REFERENCE.findall(page.read_text()):
            stem = repo.removesuffix("-GGUF").lower()
            out[f"{org}/{repo}:{quant}"] = (org, repo, f"{stem}-{quant.lower()}.gguf")
    return out


def readme_block() -> str:
    """The README's ten-minute block (the sh block that writes /etc/loki/lokid.toml)."""
    text = (REPO / "README.md").read_text()
    found = [b.text for b in docmd.blocks(text) if b.lang == "sh" and "lokid.toml" in b.text]
    assert len(found) == 1, "the README has one block with the ten-minute path"
    return found[0]


def page_lines(block: str, start: str) -> list[str]:
    """The block's command lines that start with ``start`` (comments dropped)."""
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.split("\n")]
    return [line for line in lines if line.startswith(start)]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    b = cached_build(TARGET, tmp_path_factory.mktemp(f"deb-{TARGET}"))
    assert b.rc == 0, f"dpkg-buildpackage failed on {TARGET}:\n{b.log[-6000:]}"
    hub_root = tmp_path_factory.mktemp("hub")
    served = hub_files(REPO / "README.md", TEAM_PAGE)
    assert len(served) >= 2, served   # the README's model and the team page's
    for seed, (org, repo, name) in enumerate(served.values()):
        (hub_root / org / repo).mkdir(parents=True, exist_ok=True)
        write_llama(hub_root / org / repo / name, seed=seed)
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary()),
             os.path.dirname(HUB_SCRIPT): str(HUBSTAND.parent), HUB_ROOT: str(hub_root)}
    with Container(suite=TARGET, packages=runtime_packages(TARGET), binds=binds) as ct:
        ports = {page: str(free_port()) for page in ("8000", "8081", "8082")}
        w = Walk(ct, ports)
        started = time.monotonic()
        for args in (["update"], ["install", f"/debs/{b.deb.name}"]):
            r = ct.run(["apt-get", "-q", "-y", *args], check=False, timeout=900,
                       env={"DEBIAN_FRONTEND": "noninteractive"})
            assert r.returncode == 0, f"apt-get {args}:\n{r.stdout[-4000:]}\n{r.stderr}"
        w.step("apt install ./lokid_*.deb (lokid.service running)", started)
        hub_port = free_port()
        ct.write_file("/etc/systemd/system/lokid.service.d/mirror.conf",
                      f"[Service]\nEnvironment=HF_ENDPOINT=http://127.0.0.1:{hub_port}\n")
        ct.systemctl("daemon-reload")
        ct.systemctl("restart", "lokid.service", timeout=120)
        start_in_container(ct, HUB_SCRIPT, HUB_ROOT, hub_port, "loki-hubstand.service")
        yield w
        _say("walk: " + "; ".join(f"{n}: {t:.1f} s" for n, t in w.times))


def test_the_readme_path_ends_in_an_answered_chat(walk: Walk) -> None:
    ct, block = walk.ct, readme_block()
    started = time.monotonic()
    for line in page_lines(block, "install -d"):
        walk.sh(line)
    for path, body in docmd.files((REPO / "README.md").read_text()):
        ct.write_file(path, walk.mapped(body))
    for line in page_lines(block, "systemctl daemon-reload"):
        walk.sh(line)
    walk.step("the README's files and daemon-reload", started)
    # the daemon starts the gateway's socket after the reload (docs/gateway.md): a reader
    # typing the next line takes longer than that
    started = time.monotonic()
    until("loki-gateway.socket started by the daemon after the reload",
          lambda: ct.show("loki-gateway.socket", "ActiveState")["ActiveState"] == "active",
          30, 0.1)
    walk.step("the daemon started loki-gateway.socket", started)
    started = time.monotonic()
    plan = ct.run(["lokid", "plan", "qwen"], check=False)
    assert "is not pulled yet: a start pulls it into /var/lib/loki/models first" in \
        plan.stdout + plan.stderr, (plan.stdout, plan.stderr)
    code, text = walk.chat("qwen", timeout=CHAT_TIMEOUT)
    assert code == 200, f"{code} {text}\n{walk.diagnosis('qwen')}"
    assert json.loads(text)["choices"][0]["message"]["role"] == "assistant", text
    walk.step("the README's curl: pulled, started, answered", started)
    files = ct.run(["ls", "/var/lib/loki/models"]).stdout.split()
    (pulled,) = (f for _o, _r, f in hub_files(REPO / "README.md").values())
    assert pulled in files, files


def test_the_team_page_a_second_model_on_demand_and_a_swap(walk: Walk) -> None:
    """The guide's team page after the README, as written: its files (lokid.toml, a
    second preset ``mistral`` whose model the first page copied in, ``qwen`` re-written to
    a bigger model on port 8082, both on demand in one group), the reload, ``lokid
    check``, then requests: ``mistral`` starts on demand (the running ``qwen`` goes, one
    group), and the page's request for ``qwen`` swaps back, pulling its new model."""
    ct = walk.ct
    started = time.monotonic()
    files = dict(docmd.files(TEAM_PAGE.read_text()))
    name = re.search(r'model = "([^"/]+\.gguf)"', files["/etc/loki/presets/mistral.toml"])
    assert name, files
    # the guide's first page copies the model file there; here a small real model
    _fill_model(ct, f"/var/lib/loki/models/{name.group(1)}")
    for path, body in files.items():
        ct.write_file(path, walk.mapped(body))
    blocks = [b.text for b in docmd.blocks(TEAM_PAGE.read_text()) if b.lang == "sh"]
    for line in page_lines(blocks[0], "systemctl daemon-reload"):
        walk.sh(line)
    walk.step("the team page's files and daemon-reload", started)
    started = time.monotonic()
    check = ct.run(["lokid", "check"], check=False)
    assert check.returncode == 0, (check.stdout, check.stderr)
    for preset in ("mistral", "qwen"):
        assert f"preset {preset}: ok" in check.stdout, check.stdout
    walk.step("lokid check", started)
    started = time.monotonic()
    code, body = walk.chat("mistral", timeout=CHAT_TIMEOUT)
    assert code == 200, f"{code} {body}\n{walk.diagnosis('mistral')}"
    walk.step("a request for mistral: started on demand, answered", started)
    started = time.monotonic()
    code, body = walk.chat("qwen", timeout=CHAT_TIMEOUT)
    assert code == 200, f"{code} {body}\n{walk.diagnosis('qwen')}"
    walk.step("the page's request for qwen: swapped, its new model pulled, answered",
              started)
    pulled = ct.run(["ls", "/var/lib/loki/models"]).stdout.split()
    reference = re.search(r'model = "([^"]+)"', files["/etc/loki/presets/qwen.toml"])
    assert reference, files
    assert hub_files(TEAM_PAGE)[reference.group(1)][2] in pulled, pulled
    states = {p: ct.show(f"loki-engine@{p}.service", "ActiveState")["ActiveState"]
              for p in ("mistral", "qwen")}
    assert states == {"mistral": "inactive", "qwen": "active"}, states   # one group


def _fill_model(ct: Container, path: str) -> None:
    """A small real model at ``path`` in the container, owned by loki (the reader's cp)."""
    with tempfile.TemporaryDirectory() as d:
        write_llama(Path(d) / "m.gguf", seed=3)
        ct.write_file(path, (Path(d) / "m.gguf").read_bytes())
    ct.run(["chown", "loki:loki", path])


def test_a_team_key_is_made_used_and_needed(walk: Walk) -> None:
    started = time.monotonic()
    text = (REPO / "README.md").read_text()
    add = re.search(r"`(lokictl keys add [^`]+)`", text)
    assert add, "the README shows how a key is made"
    key = walk.sh(add.group(1)).strip().split()[-1]
    assert key, "lokictl keys add printed no key"
    walk.key = key
    walk.step("lokictl keys add", started)
    started = time.monotonic()
    code, body = until("the gateway refuses a request without a key",
                       lambda: (lambda r: r if r[0] == 401 else None)(walk.chat("qwen")), 10, 0.3)
    assert "key" in body.lower(), body
    code, body = walk.chat("qwen", key=key)
    assert code == 200, (code, body)
    walk.step("a request with the key answered, one without refused", started)


def test_a_broken_preset_and_a_reboot_leave_the_others_answering(walk: Walk) -> None:
    """After the pages, what an operator meets next: a typo in one preset (``lokid check``
    names it, its requests are refused with the reason, the other model still answers),
    then the typo fixed and the server rebooted (the gateway's socket, the daemon and the
    key come back; the pulled model is not fetched again: the hub is gone with the boot)."""
    ct = walk.ct
    # the team page's key for every model (the README's is for qwen* only)
    keys = [b.text for b in docmd.blocks(TEAM_PAGE.read_text()) if "lokictl keys add" in b.text]
    (line,) = [x for x in page_lines(keys[0], "lokictl keys add") if "'*'" in x]
    every = walk.sh(line).strip().split()[-1]
    until("the gateway takes the new key (the page: within a second)",
          lambda: walk.chat("qwen", key=every)[0] == 200, 10, 0.3)
    started = time.monotonic()
    path = "/etc/loki/presets/mistral.toml"
    good = ct.read_file(path)
    ct.write_file(path, good.replace("ctx = ", "ctxx = ", 1))
    check = ct.run(["lokid", "check"], check=False)
    assert check.returncode == 2, check.stdout
    assert "preset mistral: " in check.stdout and "did you mean 'ctx'" in check.stdout, \
        check.stdout
    assert "preset qwen: ok" in check.stdout, check.stdout
    answers = [walk.chat("mistral", key=every, timeout=10)]
    deadline = time.monotonic() + 10   # the daemon reads the edit within a second
    while answers[-1][0] != 503 and time.monotonic() < deadline:
        time.sleep(0.3)
        answers.append(walk.chat("mistral", key=every, timeout=10))
    code, body = answers[-1]
    assert code == 503 and "model_broken" in body and "ctxx" in body, \
        f"{answers}\n{walk.diagnosis('mistral')}"
    code, body = walk.chat("qwen", key=walk.key)
    assert code == 200, f"{code} {body}\n{walk.diagnosis('qwen')}"
    walk.step("a typo in one preset: named by check, refused, the other answered", started)
    ct.write_file(path, good)
    started = time.monotonic()
    ct.reboot()
    until("lokid.service back after the reboot",
          lambda: ct.show("lokid.service", "ActiveState")["ActiveState"] == "active", 60, 0.2)
    walk.step("a reboot (to lokid.service active)", started)
    started = time.monotonic()
    code, body = walk.chat("qwen", key=walk.key)
    assert code == 200, f"{code} {body}\n{walk.diagnosis('qwen')}"
    code, _ = walk.chat("qwen")
    assert code == 401, code
    code, body = walk.chat("mistral", key=every)
    assert code == 200, f"{code} {body}\n{walk.diagnosis('mistral')}"
    walk.step("after the reboot: both models answered, the key still needed", started)
