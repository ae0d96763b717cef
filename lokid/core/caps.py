"""Engine capabilities: what a llama-server binary knows, from its ``--help`` and ``--version``.

Parsing only (pure): running the binary is :mod:`lokid.engine.probe`'s job.
The spec guards look at the help text rather than at a version number,
because a self-built engine or a fork may report any build and still lack a
flag, or have it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "version: 0.6.0-dev (build 11434, commit 1a2b3c4)": llama.cpp since the
# version/build split.
_VERSION_NEW = re.compile(r"version:\s*\S+\s*\(build\s+(\d+)(?:,\s*commit\s+([0-9A-Za-z]+))?")
# "version: 6543 (abcdef12)": older builds, where the version is the build.
_VERSION_OLD = re.compile(r"version:\s*(\d+)\s*\(([0-9A-Za-z]+)\)")
# A flag as help lists it: "-m,    --model FNAME", "--spec-type [none|draft-mtp,...]".
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)")


@dataclass(frozen=True)
class EngineCaps:
    """What one engine binary supports."""

    path: str
    build: int            # 0 = unknown (a local build without a build number, a fork)
    commit: str
    version_text: str
    help_text: str
    flags: frozenset[str]

    def knows(self, flag: str) -> bool:
        return flag in self.flags

    def mentions(self, word: str) -> bool:
        """True when the help text contains ``word`` (a value such as ``draft-mtp``)."""
        return word in self.help_text


def parse_version(text: str) -> tuple[int, str]:
    """Build number and commit from ``--version`` output; (0, "") when unknown."""
    m = _VERSION_NEW.search(text)
    if m:
        return int(m.group(1)), m.group(2) or ""
    m = _VERSION_OLD.search(text)
    if m:
        return int(m.group(1)), m.group(2)
    return 0, ""


def parse_flags(help_text: str) -> frozenset[str]:
    """Every flag the help text lists at the start of an option line.

    Only the option column counts: a flag mentioned in another flag's
    description (such as "--draft-max was removed") is not a flag this engine
    accepts.
    """
    flags: set[str] = set()
    for line in help_text.splitlines():
        # Option lines start in column 0; indented lines continue a description.
        if not line.startswith("-"):
            continue
        # Aliases are separated by ", " or by a run of spaces ("-fit,  --fit"); the
        # description is the first segment that does not start with a dash.
        for segment in re.split(r"\s{2,}", line.strip()):
            if not segment.startswith("-"):
                break
            for m in _FLAG.finditer(segment):
                flags.add(m.group(1))
    return frozenset(flags)


def parse_caps(path: str, version_text: str, help_text: str) -> EngineCaps:
    build, commit = parse_version(version_text)
    return EngineCaps(
        path=path,
        build=build,
        commit=commit,
        version_text=version_text.strip(),
        help_text=help_text,
        flags=parse_flags(help_text),
    )
