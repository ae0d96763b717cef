"""lokid.core.access: who may read a model or run the engine, from mode bits (table tests)."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from lokid.core import access
from lokid.core.access import EXECUTE, READ, Node, User

LOKI = User("loki", 990, frozenset({990, 44, 993}), "loki")   # loki, video, render
ROOT = User("root", 0, frozenset({0}), "root")
DIR, FILE = stat.S_IFDIR, stat.S_IFREG


def node(path: str, mode: int, uid: int = 0, gid: int = 0, acl: bool = False) -> Node:
    kind = DIR if not path.endswith((".gguf", "server", "shadow")) else FILE
    return Node(path, kind | mode, uid, gid, "root" if uid == 0 else str(uid),
                "root" if gid == 0 else str(gid), acl)


@pytest.mark.parametrize("user,mode,uid,gid,bit,expected", [
    (LOKI, 0o644, 0, 0, READ, True),            # others may read
    (LOKI, 0o640, 0, 0, READ, False),           # not in the group
    (LOKI, 0o640, 0, 990, READ, True),          # its primary group
    (LOKI, 0o640, 0, 44, READ, True),           # a supplementary group (video)
    (LOKI, 0o064, 990, 0, READ, False),         # the owner's bits decide for the owner
    (LOKI, 0o064, 0, 990, READ, True),
    (LOKI, 0o604, 0, 990, READ, False),         # the group's bits decide for the group
    (LOKI, 0o755, 0, 0, EXECUTE, True),
    (LOKI, 0o750, 0, 0, EXECUTE, False),
    (LOKI, 0o700, 0, 0, READ, False),
    (ROOT, 0o000, 990, 990, READ, True),         # root reads everything
    (ROOT, 0o644, 990, 990, EXECUTE, False),     # ... and runs only what has an x bit
    (ROOT, 0o744, 990, 990, EXECUTE, True),
])
def test_permits_one_class_decides(user: User, mode: int, uid: int, gid: int, bit: int,
                                   expected: bool) -> None:
    assert access.permits(user, node("/m/x.gguf", mode, uid, gid), bit) is expected


def test_root_searches_any_directory() -> None:
    assert access.permits(ROOT, node("/m", 0o000), EXECUTE)


def test_an_acl_is_not_evaluated_and_never_blocks() -> None:
    assert access.permits(LOKI, node("/m", 0o700, acl=True), EXECUTE)


def chain(*modes: tuple[str, int]) -> list[Node]:
    return [node(p, m) for p, m in modes]


@pytest.mark.parametrize("modes,bit,blocked", [
    ([("/", 0o755), ("/m", 0o755), ("/m/x.gguf", 0o644)], READ, None),
    ([("/", 0o755), ("/m", 0o700), ("/m/x.gguf", 0o644)], READ, "/m"),
    ([("/", 0o755), ("/m", 0o711), ("/m/x.gguf", 0o600)], READ, "/m/x.gguf"),
    ([("/", 0o755), ("/m", 0o754), ("/m/x.gguf", 0o644)], READ, "/m"),   # r without x
    ([("/", 0o755), ("/a", 0o700), ("/a/b", 0o700), ("/a/b/x.gguf", 0o600)], READ, "/a"),
    ([("/", 0o755), ("/opt", 0o755), ("/opt/llama-server", 0o744)], EXECUTE,
     "/opt/llama-server"),
    ([("/", 0o755), ("/opt", 0o755), ("/opt/llama-server", 0o755)], EXECUTE, None),
    ([("/", 0o755), ("/opt", 0o755), ("/opt/llama-server", 0o711)], EXECUTE, None),
])
def test_the_first_component_that_blocks(modes: list[tuple[str, int]], bit: int,
                                         blocked: str | None) -> None:
    found = access.blocker(LOKI, chain(*modes), bit)
    assert (found.path if found else None) == blocked


def test_the_error_for_a_file_names_its_owner_mode_and_fix() -> None:
    n = node("/m/x.gguf", 0o600)
    assert access.not_permitted("model", "/m/x.gguf", LOKI, n, READ) == (
        "model /m/x.gguf is not readable by user loki (owner root:root, mode 0600): "
        "chmod o+r /m/x.gguf, or chgrp loki /m/x.gguf and chmod g+r /m/x.gguf")


def test_the_error_for_a_directory_names_it() -> None:
    n = node("/srv/models", 0o700)
    assert access.not_permitted("model", "/srv/models/x.gguf", LOKI, n, READ) == (
        "model /srv/models/x.gguf is not readable by user loki: directory /srv/models "
        "(owner root:root, mode 0700) is not searchable by it: chmod o+x /srv/models, "
        "or chgrp loki /srv/models and chmod g+x /srv/models")


@pytest.mark.parametrize("uid,gid,fix", [
    (990, 0, "chmod u+x /opt/llama-server"),
    (0, 44, "chmod g+x /opt/llama-server"),
])
def test_the_fix_is_for_the_class_that_decides(uid: int, gid: int, fix: str) -> None:
    n = node("/opt/llama-server", 0o644, uid, gid)
    text = access.not_permitted("engine", "/opt/llama-server", LOKI, n, EXECUTE)
    assert text.startswith("engine /opt/llama-server is not executable by user loki (")
    assert text.endswith(": " + fix)


def test_permission_denied_for_this_process() -> None:
    me = User("bob", 1000, frozenset({1000}), "bob")
    assert access.permission_denied("model", "/m/x.gguf", me, node("/m", 0o700), READ) == (
        "model /m/x.gguf: permission denied for user bob: directory /m (owner root:root, "
        "mode 0700) is not searchable by it: chmod o+x /m, or chgrp bob /m and chmod g+x /m")
    assert access.permission_denied("model", "/m/x.gguf", me, node("/m/x.gguf", 0o600),
                                    READ).endswith(
        "the file (owner root:root, mode 0600) is not readable by it: chmod o+r /m/x.gguf, "
        "or chgrp bob /m/x.gguf and chmod g+r /m/x.gguf")
    # model = "/etc/shadow": never the advice to open up a file that is no model
    shadow = access.permission_denied("model", "/etc/shadow", me, node("/etc/shadow", 0o640),
                                      READ)
    assert shadow.endswith("is not readable by it: is it the right file? its name does not "
                           "end in .gguf") and "chmod" not in shadow, shadow
    # an ACL or an LSM refused: the mode bits cannot say which component
    assert access.permission_denied("model", "/m/x.gguf", me, None, READ) == (
        "model /m/x.gguf: permission denied for user bob")


def test_the_engine_user_and_its_override() -> None:
    assert access.engine_user({}) == "loki"
    assert access.engine_user({"LOKI_ENGINE_USER": " tester "}) == "tester"


def test_the_user_and_groups_are_the_units() -> None:
    unit = (Path(__file__).parents[2] / "units" / "loki-engine@.service").read_text()
    assert re.search(r"^User=(\S+)$", unit, re.M)[1] == access.ENGINE_USER  # type: ignore[index]
    groups = re.search(r"^SupplementaryGroups=(.*)$", unit, re.M)[1]  # type: ignore[index]
    assert tuple(groups.split()) == access.ENGINE_GROUPS


@pytest.mark.parametrize("uid,port,start,capable,expected", [
    (990, 80, 1024, False, False),      # loki, a privileged port
    (990, 1023, 1024, False, False),
    (990, 1024, 1024, False, True),     # from the sysctl's value up: anyone's
    (990, 8080, 1024, False, True),
    (990, 80, 80, False, True),         # the sysctl lowered to the port
    (990, 80, 0, False, True),          # ... or to 0 (what container runtimes often set)
    (990, 80, 1024, True, True),        # CAP_NET_BIND_SERVICE
    (0, 80, 1024, False, True),         # root
    (990, 8080, 10000, False, False),   # the sysctl raised
])
def test_may_listen_below_the_unprivileged_start_only_root_or_the_capability(
        uid: int, port: int, start: int, capable: bool, expected: bool) -> None:
    assert access.may_listen(uid, port, start, capable) is expected


def test_the_unit_gives_its_user_no_capability() -> None:
    # a plan made as root says the unit's user may not bind a low port: true while the
    # unit grants no CAP_NET_BIND_SERVICE
    unit = (Path(__file__).parents[2] / "units" / "loki-engine@.service").read_text()
    assert not re.search(r"^AmbientCapabilities=", unit, re.M)
    assert re.search(r"^User=(?!root$)", unit, re.M)
