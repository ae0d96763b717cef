"""The README's ten-minute path and the guide's team page, walked as a newcomer walks them,
under real systemd in a Debian 13 container with the .deb installed by apt (issue 49).

Each file the pages write is the page's own text (README.md's here-documents, the guide's
TOML blocks naming a file, read with :mod:`support.docmd`), written where the page says;
each command run is the page's. What cannot be the page's is mapped, and only that:
- the engine: the page says ``/usr/bin/llama-server``; the container has the real engine
  b11434 at /opt/engine (lokid ships none: an operator installs one);
- the hub: lokid.service gets ``HF_ENDPOINT`` (a drop-in, as an operator sets a mirror)
  pointing at the stand-in (:mod:`support.hubstand`) inside the container, which serves
  the README's repository, ``Qwen/Qwen2.5-1.5B-Instruct-GGUF``, as a small real model;
- the ports: the container shares the host's network, so the pages' 8000 and 8081 become
  free ports of the host;
- the guide's ``cp`` of a model file: a small real model is put there.

The walk: apt install; the README's steps to a chat answered through the gateway (its
start pulls the model); the guide's second preset, answered on demand; a team key, used
and needed. Each step's wall time is said on the terminal (the closing note of issue 49
quotes them), never asserted. A step a reader would miss fails here with what happened.

Run it with pytest (it is a walk, not part of ``make test`` yet: see below)::

    .venv/bin/python -m pytest -p no:cacheprovider scripts/walk_readme.py -v -s

What it found on its first run (issue 49, left open): the README's path does not end in
an answer. Its files, the reload and the gateway's socket are fine; the first request
starts ``loki-engine@qwen``, whose start pulls the model through the daemon and loads
it ("ready at http://127.0.0.1:8080" in the unit's journal, 0.03 s after the load), but
the gateway never answers the request: the client gives up after 300 s (the gateway's
journal: ``anonymous /v1/chat/completions qwen 499``). The same path without systemd
(tests/gateway/test_pull_on_request.py) is answered. It moves into tests/packaging/ once
that is fixed, so that CI walks it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import REPO, docmd  # noqa: E402  (the tests' helpers, as the benchmarks use them)
from support.debpkg import TARGET, cached_build, runtime_packages
from support.enginekit import engine_binary, free_port
from support.hubstand import start_in_container
from support.models import write_llama
from support.systemd_harness import Container, _say, until

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ENGINE_DIR = "/opt/engine"
HUB_SCRIPT = "/opt/hubstand/hubstand.py"
HUB_ROOT = "/srv/hub"
README_REPO = ("Qwen", "Qwen2.5-1.5B-Instruct-GGUF")
README_FILE = "qwen2.5-1.5b-instruct-q4_k_m.gguf"
HUBSTAND = Path(__file__).resolve().parents[1] / "support" / "hubstand.py"


@dataclass
class Walk:
    ct: Container
    ports: dict[str, str]                       # the pages' port -> this walk's
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

    def chat(self, model: str, key: str | None = None, timeout: float = 300) -> tuple[int, str]:
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
    repo = hub_root.joinpath(*README_REPO)
    repo.mkdir(parents=True)
    write_llama(repo / README_FILE)
    binds = {"/debs": str(b.deb.parent), ENGINE_DIR: os.path.dirname(engine_binary()),
             os.path.dirname(HUB_SCRIPT): str(HUBSTAND.parent), HUB_ROOT: str(hub_root)}
    with Container(suite=TARGET, packages=runtime_packages(TARGET), binds=binds) as ct:
        ports = {"8000": str(free_port()), "8081": str(free_port())}
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
    code, text = walk.chat("qwen")
    assert code == 200, (code, text, ct.journal("loki-engine@qwen.service"),
                         ct.journal("loki-gateway.service"))
    assert json.loads(text)["choices"][0]["message"]["role"] == "assistant", text
    walk.step("the README's curl: pulled, started, answered", started)
    files = ct.run(["ls", "/var/lib/loki/models"]).stdout.split()
    assert README_FILE in files, files


def test_a_second_model_on_demand_from_the_guide(walk: Walk) -> None:
    ct = walk.ct
    text = (REPO / "docs" / "guide" / "team.md").read_text()
    mistral = dict(docmd.files(text))["/etc/loki/presets/mistral.toml"]
    started = time.monotonic()
    name = re.search(r'model = "([^"]+\.gguf)"', mistral)
    assert name, mistral
    # the guide's first page copies the model file there; here a small real model
    _fill_model(ct, f"/var/lib/loki/models/{name.group(1)}")
    ct.write_file("/etc/loki/presets/mistral.toml", walk.mapped(mistral))
    walk.step("the guide's second preset written", started)
    started = time.monotonic()
    code, body = walk.chat("mistral")
    assert code == 200, (code, body, ct.journal("loki-engine@mistral.service"),
                         ct.journal("loki-gateway.service"))
    walk.step("a request for it: started on demand, answered", started)


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
    walk.step("lokictl keys add", started)
    started = time.monotonic()
    code, body = until("the gateway refuses a request without a key",
                       lambda: (lambda r: r if r[0] == 401 else None)(walk.chat("qwen")), 10, 0.3)
    assert "key" in body.lower(), body
    code, body = walk.chat("qwen", key=key)
    assert code == 200, (code, body)
    walk.step("a request with the key answered, one without refused", started)
