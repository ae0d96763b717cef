"""One file's download (lokid.host.download) against the hub's stand-in
(tests/support/hubstand.py) in a process of its own, with its faults: a fresh fetch, a
resume after a cut, a corrupt byte, a lying length, an overrunning server, a server that
ignores ranges, refusals, a disk that fills (a real small tmpfs), two pulls of one file,
and a target already in place (the same file: nothing asked; another: left alone)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.hubstand import hub_running, requests_log, set_faults
from support.smallfs import fill

from lokid.core.errors import (
    HubError,
    NoSpaceError,
    PullBusyError,
    PullCorruptError,
    PullCutError,
    PullError,
)
from lokid.host import download, hub

MIB = 1 << 20
SIZES = {"m-Q4_K_M.gguf": 3 * MIB, "big-Q8_0.gguf": 4 * MIB, "small-Q2_K.gguf": 2 * MIB}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    rng = random.Random(48)
    return {name: rng.randbytes(n) for name, n in SIZES.items()}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes]) -> Iterator[str]:
    root = tmp_path_factory.mktemp("hub")
    (root / "org" / "m").mkdir(parents=True)
    for name, data in files.items():
        (root / "org" / "m" / name).write_bytes(data)
    with hub_running(root) as url:
        yield url


class Pull:
    """download() of one stand-in file with its listed size and SHA-256 (or none)."""

    def __init__(self, client: httpx.Client, base: str, files: dict[str, bytes]) -> None:
        self.client, self.base, self.files = client, base, files

    def __call__(self, name: str, target: Path, *, listed: bool = True,
                 **kw: Any) -> download.Fetched:
        data = self.files[name]
        kw.setdefault("size", len(data) if listed else None)
        kw.setdefault("sha256", hashlib.sha256(data).hexdigest().upper() if listed else None)
        return download.download(self.client, f"{self.base}/org/m/resolve/main/{name}",
                                 str(target), chunk=256 << 10, **kw)

    def asked(self, since: int) -> list[dict[str, Any]]:
        return [r for r in requests_log(self.base)[since:] if r["path"].startswith("/_cdn/")]


@pytest.fixture
def pull(client: httpx.Client, base: str, files: dict[str, bytes]) -> Pull:
    return Pull(client, base, files)


def part_of(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def test_a_fresh_download_is_whole_verified_and_in_place(pull: Pull, tmp_path: Path,
                                                         files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    seen: list[tuple[int, int | None]] = []
    got = pull("m-Q4_K_M.gguf", target, progress=lambda d, t: seen.append((d, t)))
    data = files["m-Q4_K_M.gguf"]
    assert target.read_bytes() == data
    assert got == download.Fetched(str(target), len(data), hashlib.sha256(data).hexdigest(),
                                   0, False)
    assert not part_of(target).exists()
    assert seen[-1] == (len(data), len(data))
    assert [d for d, _ in seen] == sorted({d for d, _ in seen})   # rising, once a chunk
    assert len(seen) == len(data) // (256 << 10)


def test_a_cut_transfer_is_kept_and_resumed(pull: Pull, base: str, tmp_path: Path,
                                            files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, cut_after=1_500_000)
    with pytest.raises(PullCutError, match="pull again to resume") as e:
        pull("m-Q4_K_M.gguf", target)
    assert e.value.retry
    kept = part_of(target).stat().st_size
    assert 0 < kept <= 1_500_000 and not target.exists()
    set_faults(base)
    since = len(requests_log(base))
    got = pull("m-Q4_K_M.gguf", target)
    assert got.resumed_from == kept and got.size == len(files["m-Q4_K_M.gguf"])
    assert target.read_bytes() == files["m-Q4_K_M.gguf"]
    assert [r["range"] for r in pull.asked(since)] == [f"bytes={kept}-"]


def test_a_corrupt_byte_is_refused_and_the_part_removed(pull: Pull, base: str,
                                                        tmp_path: Path) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, corrupt_at=1_000_000)
    with pytest.raises(PullCorruptError, match="not the file listed") as e:
        pull("m-Q4_K_M.gguf", target)
    assert not e.value.retry
    assert not target.exists() and not part_of(target).exists()


def test_a_plain_url_is_checked_against_the_hubs_linked_etag(pull: Pull, base: str,
                                                             tmp_path: Path) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, corrupt_at=5)
    with pytest.raises(PullCorruptError):
        pull("m-Q4_K_M.gguf", target, listed=False)
    set_faults(base)
    got = pull("m-Q4_K_M.gguf", target, listed=False)
    assert got.sha256 == hashlib.sha256(target.read_bytes()).hexdigest()


def test_a_lying_length_is_refused_and_the_part_kept(pull: Pull, base: str,
                                                     tmp_path: Path) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, cut_after=1_000_000)
    with pytest.raises(PullCutError):
        pull("m-Q4_K_M.gguf", target)
    kept = part_of(target).stat().st_size
    set_faults(base, lie_length=100)
    with pytest.raises(HubError, match=f"announces {3 * MIB + 100} bytes where the listing "
                                       f"says {3 * MIB}") as e:
        pull("m-Q4_K_M.gguf", target)
    assert not e.value.retry
    assert part_of(target).stat().st_size == kept and not target.exists()


def test_an_overrunning_body_is_refused_and_the_part_removed(pull: Pull, base: str,
                                                             tmp_path: Path) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, extra_bytes=1000, no_length=True)   # the body ends with the connection
    with pytest.raises(PullCorruptError, match=f"more than the file's {3 * MIB} bytes"):
        pull("m-Q4_K_M.gguf", target)
    assert not target.exists() and not part_of(target).exists()


def test_bytes_past_an_honest_length_never_reach_the_file(pull: Pull, base: str,
                                                          tmp_path: Path,
                                                          files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, extra_bytes=1000)   # Content-Length says the file's length
    got = pull("m-Q4_K_M.gguf", target)
    assert got.size == 3 * MIB and target.read_bytes() == files["m-Q4_K_M.gguf"]


def test_a_server_ignoring_ranges_starts_over(pull: Pull, base: str, tmp_path: Path,
                                              files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    set_faults(base, cut_after=1_000_000)
    with pytest.raises(PullCutError):
        pull("m-Q4_K_M.gguf", target)
    set_faults(base, ignore_range=True)
    since = len(requests_log(base))
    got = pull("m-Q4_K_M.gguf", target)
    assert got.resumed_from == 0 and target.read_bytes() == files["m-Q4_K_M.gguf"]
    assert pull.asked(since)[0]["range"] is not None   # it was asked, and ignored


def test_a_whole_part_left_before_its_rename_is_checked_not_fetched(
        pull: Pull, base: str, tmp_path: Path, files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    part_of(target).write_bytes(files["m-Q4_K_M.gguf"])
    since = len(requests_log(base))
    got = pull("m-Q4_K_M.gguf", target, sha256=None)   # the 416 path: the hash from headers
    assert got.resumed_from == 3 * MIB and not got.already
    assert [r["range"] for r in pull.asked(since)] == [f"bytes={3 * MIB}-"]
    assert target.read_bytes() == files["m-Q4_K_M.gguf"]


def test_refusals_are_hub_errors(pull: Pull, base: str, tmp_path: Path) -> None:
    set_faults(base, status=503)
    with pytest.raises(HubError, match="HTTP 503") as e:
        pull("m-Q4_K_M.gguf", tmp_path / "m.gguf")
    assert e.value.retry
    set_faults(base)
    with pytest.raises(HubError, match="no such repository, revision or file") as e:
        download.download(pull.client, f"{base}/org/m/resolve/main/none.gguf",
                          str(tmp_path / "none.gguf"), size=None, sha256=None)
    assert not e.value.retry
    set_faults(base, loop=True)
    with pytest.raises(HubError, match="redirects without end") as e:
        pull("m-Q4_K_M.gguf", tmp_path / "m.gguf")
    assert not e.value.retry and not (tmp_path / "m.gguf").exists()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB file system (a tmpfs: mounting needs root, which these tests run as)."""
    fs = tmp_path / "fs"
    fs.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(fs)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if os.geteuid() != 0 or "permission denied" in r.stderr.lower():
            pytest.skip(f"cannot mount a tmpfs here (EPERM): {r.stderr.strip()}")
        pytest.fail(f"mount: {r.stderr.strip()}")
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_no_room_is_refused_before_the_request(pull: Pull, base: str, small_fs: Path) -> None:
    since = len(requests_log(base))
    with pytest.raises(NoSpaceError, match=r"has 3\.0 MiB free; big-Q8_0.gguf needs 4\.0 MiB"):
        pull("big-Q8_0.gguf", small_fs / "big-Q8_0.gguf", reserve=0)
    assert requests_log(base)[since:] == []


def test_a_disk_filling_mid_transfer_keeps_the_part(pull: Pull, small_fs: Path,
                                                    files: dict[str, bytes]) -> None:
    target = small_fs / "small-Q2_K.gguf"

    def filler(done: int, total: int | None) -> None:   # another writer takes the rest
        if not (small_fs / "fill").exists():
            fill(small_fs)

    with pytest.raises(NoSpaceError, match="free some space and pull again") as e:
        pull("small-Q2_K.gguf", target, reserve=0, progress=filler)
    assert not e.value.retry
    kept = part_of(target).stat().st_size
    assert kept > 0 and not target.exists()
    (small_fs / "fill").unlink()
    got = pull("small-Q2_K.gguf", target, reserve=0)
    assert got.resumed_from == kept and target.read_bytes() == files["small-Q2_K.gguf"]


def test_a_second_pull_of_one_file_is_busy(pull: Pull, tmp_path: Path,
                                           files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    started, go = threading.Event(), threading.Event()
    out: list[object] = []

    def first() -> None:
        def held(done: int, total: int | None) -> None:
            started.set()
            go.wait(30)
        try:
            out.append(pull("m-Q4_K_M.gguf", target, progress=held))
        except Exception as e:   # noqa: BLE001 (shown by the assert below)
            out.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(30)
        with hub.make_client(None, "lokid-test") as other, \
                pytest.raises(PullBusyError, match="being pulled by another pull"):
            download.download(other, f"{pull.base}/org/m/resolve/main/m-Q4_K_M.gguf",
                              str(target), size=3 * MIB, sha256=None)
    finally:
        go.set()
        t.join(30)
    assert isinstance(out[0], download.Fetched), out
    assert target.read_bytes() == files["m-Q4_K_M.gguf"]


def test_the_same_file_in_place_is_not_fetched(pull: Pull, base: str, tmp_path: Path,
                                               files: dict[str, bytes]) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    target.write_bytes(files["m-Q4_K_M.gguf"])
    since = len(requests_log(base))
    got = pull("m-Q4_K_M.gguf", target)
    assert got.already and got.size == 3 * MIB and got.resumed_from == 0
    assert got.sha256 == hashlib.sha256(files["m-Q4_K_M.gguf"]).hexdigest()
    assert pull("m-Q4_K_M.gguf", target, sha256=None).already   # the size alone
    assert requests_log(base)[since:] == []
    assert not part_of(target).exists()


def test_another_file_in_place_is_refused_and_left_alone(pull: Pull, base: str,
                                                         tmp_path: Path) -> None:
    target = tmp_path / "m-Q4_K_M.gguf"
    since = len(requests_log(base))
    for size in (3 * MIB, 2 * MIB):   # the same size (told by its hash) and another
        mine = b"an operator's own file".ljust(size, b"!")
        target.write_bytes(mine)
        with pytest.raises(PullError, match="not the file pulled.*move it away") as e:
            pull("m-Q4_K_M.gguf", target)
        assert type(e.value) is PullError and not e.value.retry
        assert target.read_bytes() == mine and not part_of(target).exists()
    with pytest.raises(PullError, match="2097152 bytes where the file has 3145728"):
        pull("m-Q4_K_M.gguf", target, sha256=None)   # no hash listed: the size tells
    assert requests_log(base)[since:] == []
