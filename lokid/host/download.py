"""One model file fetched over HTTP (issue 48): resumable, verified, never half in place.

:func:`download` fetches ``url`` to ``target`` with the pull's client (:mod:`lokid.host.hub`)
and returns a :class:`Fetched`, or raises a :class:`~lokid.core.errors.PullError` written for
the operator: :class:`~lokid.core.errors.HubError` (the server refused, or lied about the
length: the partial file is kept), :class:`~lokid.core.errors.PullCutError` (the transfer
ended early: kept, the next pull resumes), :class:`~lokid.core.errors.PullCorruptError`
(the bytes are not the hub's: the partial file is removed), :class:`~lokid.core.errors.
NoSpaceError` (kept), :class:`~lokid.core.errors.PullBusyError`, or a plain ``PullError``
(a file in the way). It never logs; ``progress(done, total)`` is called at most once a
chunk. The rules, each with the failure it prevents:

- The bytes go to ``<target>.part`` in the target's directory, a name no preset takes for a
  model (it does not end ``.gguf``), and are renamed into place with ``os.replace`` only
  after the size and SHA-256 checks and an fsync of the file, then of the directory: a
  preset never loads a partial file, and a crash never leaves a named but empty one.
- One pull of a file at a time: the part is opened (``O_CREAT``, 0640, never through a
  symlink) and locked (``flock``, not waiting); a second pull gets ``PullBusyError`` instead
  of two writers interleaving one file. The lock held, the part's inode is checked to still
  be the one its name holds (else the pull before renamed or removed it: open anew), and
  the target is checked again (that pull may have put it in place).
- A target already there is judged, never overwritten: its SHA-256 (or, unknown, its size;
  both unknown, what the server's headers say) equal to the hub's is ``already`` with no
  transfer; different, the pull is refused and the file left as it is, since it may be an
  operator's own.
- Free space is checked before the request (``statvfs``: the rest of the file plus
  ``reserve`` left free), so a pull that cannot fit fails at once, not after filling the
  disk other services write to; ENOSPC or EDQUOT while writing is a ``NoSpaceError`` too,
  the part kept: free space and pull again, it resumes.
- Resume: the part's bytes are hashed first (the SHA-256 covers the whole file), then
  ``Range: bytes=<have>-`` is asked. A 206 must start at ``have`` and its total be the
  listed size, or the pull is refused (appending a range that is not the rest corrupts the
  file); a 200 (ranges ignored) starts over from byte 0; a 416 with the part whole goes
  to the check. ``Accept-Encoding: identity``: offsets and sizes are the file's bytes, never
  those of a compressed form.
- Lengths that lie: a Content-Length or Content-Range total other than the listed size is a
  ``HubError`` (the part kept: the listing or the mirror is wrong, not the bytes); a body
  running past the size stops being read there and the part is removed (``PullCorruptError``:
  no extra byte is ever appended); a body ending short, or a transport error mid-body, is a
  ``PullCutError`` saying what is kept.
- Refusals read as the listing's (:func:`lokid.host.hub.status_error`: 401/403, 404, 429
  and 5xx retryable); a redirect loop ends at httpx's 20 redirects as a ``HubError``,
  never a worker spinning between two hosts.
- A SHA-256 other than the listed one removes the part (``PullCorruptError``): pulling
  again resumes nothing of a corrupt file. Without a listed one (a plain URL), the hub's
  ``X-Linked-Etag`` (on the redirect the hub answers) or a 64-hex ``ETag`` is taken; else
  only the size is checked, and the hash computed is reported.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
from dataclasses import dataclass

import httpx

from ..core.errors import (
    HubError,
    NoSpaceError,
    PullBusyError,
    PullCorruptError,
    PullCutError,
    PullError,
    printable,
)
from .hub import status_error, transport_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Progress = Callable[[int, int | None], None]

WHAT = "repository, revision or file"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_RANGE = re.compile(r"bytes\s+(\d{1,20})-(\d{1,20})/(\d{1,20}|\*)")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d{1,20})")


@dataclass(frozen=True)
class Fetched:
    """A file in place and verified."""

    path: str          # final path
    size: int
    sha256: str        # lowercase hex of what is in place
    resumed_from: int  # bytes that were already there (0 for a fresh start)
    already: bool      # the file was in place and verified: nothing fetched


def download(client: httpx.Client, url: str, target: str, *, size: int | None,
             sha256: str | None, progress: Progress | None = None,
             reserve: int = 64 << 20, chunk: int = 1 << 20) -> Fetched:
    """Fetch ``url`` to ``target`` (``size`` and ``sha256`` as the listing says, or None),
    resuming a ``.part`` left by an earlier pull; see the module's rules."""
    want = sha256.lower() if sha256 else None
    if os.path.lexists(target):
        return _in_place(client, url, target, size, want, progress, chunk)
    part = target + ".part"
    fd = _lock(part)
    try:
        if os.path.lexists(target):   # the pull that held the lock has put it in place
            if os.fstat(fd).st_size == 0:
                os.unlink(part)
            return _in_place(client, url, target, size, want, progress, chunk)
        return _fetch(client, url, target, part, fd, size, want, progress, reserve, chunk)
    finally:
        os.close(fd)


def _lock(part: str) -> int:
    """The part's descriptor, created if need be and locked; its name still holds it."""
    for _ in range(3):
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except OSError as e:
            raise _os_error(e, f"cannot open {part}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PullBusyError(f"{_p(part)} is being pulled by another pull (pid unknown): "
                                "wait for it to end, or stop it, then pull again") from None
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            os.close(fd)
            raise PullError(f"{_p(part)} is not a regular file: move it away and pull again")
        try:
            named = os.stat(part, follow_symlinks=False)
        except FileNotFoundError:
            named = None
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)   # renamed into place or removed by the pull that held it: anew
    raise PullBusyError(f"{_p(part)} keeps changing under another pull: pull again later")


def _fetch(client: httpx.Client, url: str, target: str, part: str, fd: int,
           size: int | None, want: str | None, progress: Progress | None,
           reserve: int, chunk: int) -> Fetched:
    have = os.fstat(fd).st_size
    if size is not None and have > size:   # longer than the file: not a part of it
        _truncate(fd, part)
        have = 0
    hasher = _hash_fd(fd, have, size, progress, chunk, part)
    if have and have == size and want is not None:   # whole already: a crash before rename
        return _finish(url, target, part, fd, hasher, have, have, want)
    if size is not None:
        _room(os.path.dirname(target) or ".", size - have, reserve, target)
    for _ in range(2):
        headers = {"Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with client.stream("GET", url, headers=headers) as r:
                if r.status_code == 416 and have:
                    total = _int(_UNSATISFIED.fullmatch(r.headers.get("content-range", "")))
                    if have == (size if size is not None else total):
                        return _finish(url, target, part, fd, hasher, have, have,
                                       want or _header_sha(r))
                    _truncate(fd, part)   # the part is longer than the server's file
                    have, hasher = 0, hashlib.sha256()
                    continue
                total = _expected(r, url, part, have, size)
                anew = r.status_code != 206 and have > 0   # the server ignores ranges
                if anew:
                    _truncate(fd, part)
                    have, hasher = 0, hashlib.sha256()
                if total is not None and (size is None or anew):
                    _room(os.path.dirname(target) or ".", total - have, reserve, target)
                got = want or _header_sha(r)
                done = _body(r, url, part, fd, hasher, have, total, progress, chunk)
                return _finish(url, target, part, fd, hasher, done, have, got)
        except httpx.HTTPError as e:
            raise transport_error(e, url) from None
    raise HubError(f"{_p(url)} answers 416 (range not satisfiable) to a pull from byte 0")


def _expected(r: httpx.Response, url: str, part: str, have: int, size: int | None
              ) -> int | None:
    """The file's length the answer's head announces, refused where it is not the listed
    one; None when neither says."""
    fail = status_error(r, url, WHAT)
    if fail is not None:
        raise fail
    length = _int(re.fullmatch(r"\d{1,20}", r.headers.get("content-length", "").strip()))
    if r.status_code == 206:
        m = _RANGE.fullmatch(r.headers.get("content-range", "").strip())
        if not have or m is None or m.group(3) == "*":
            raise HubError(f"{_p(url)} answers a partial content without a usable "
                           "Content-Range: not a server a pull can resume from")
        start, total = int(m.group(1)), int(m.group(3))
        if start != have:
            raise HubError(f"{_p(url)} sends bytes from {start} where {have} were asked "
                           f"for; {_p(part)} is kept")
        if size is not None and total != size:
            raise _lie(url, part, total, size)
        if length is not None and have + length != total:
            raise _lie(url, part, have + length, total)
        return total
    if r.status_code != 200:
        raise HubError(f"{_p(url)} answers HTTP {r.status_code}, not the file")
    if size is not None and length is not None and length != size:
        raise _lie(url, part, length, size)
    return size if size is not None else length


def _body(r: httpx.Response, url: str, part: str, fd: int, hasher: hashlib._Hash, have: int,
          total: int | None, progress: Progress | None, chunk: int) -> int:
    """Write the body after the part's ``have`` bytes; the length in the end."""
    done = have
    try:
        for data in r.iter_bytes(chunk):
            if total is not None and done + len(data) > total:
                os.unlink(part)
                raise PullCorruptError(f"{_p(url)} sends more than the file's {total} bytes: "
                                       f"not the file listed; {_p(part)} is removed")
            _write(fd, data, done, part)
            hasher.update(data)
            done += len(data)
            if progress is not None:
                progress(done, total)
    except httpx.TransportError as e:
        raise PullCutError(f"the transfer of {_p(url)} was cut ({type(e).__name__}): "
                           f"{_kept(done, total)} kept in {_p(part)}; pull again to "
                           "resume") from None
    if total is not None and done < total:
        raise PullCutError(f"the transfer of {_p(url)} ended early: {_kept(done, total)} "
                           f"kept in {_p(part)}; pull again to resume")
    return done


def _finish(url: str, target: str, part: str, fd: int, hasher: hashlib._Hash, done: int,
            resumed_from: int, want: str | None) -> Fetched:
    """Check, fsync, rename into place, fsync the directory."""
    got = hasher.hexdigest()
    if want is not None and got != want:
        os.unlink(part)
        raise PullCorruptError(f"{_p(url)} came whole but is not the file listed: SHA-256 "
                               f"{got[:12]}… where {want[:12]}… was expected; {_p(part)} is "
                               "removed, pull again")
    try:
        os.fsync(fd)
        os.replace(part, target)
        dfd = os.open(os.path.dirname(target) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise _os_error(e, f"cannot put {part} in place") from None
    return Fetched(target, done, got, resumed_from, False)


def _in_place(client: httpx.Client, url: str, target: str, size: int | None,
              want: str | None, progress: Progress | None, chunk: int) -> Fetched:
    """The target already there, judged: ``already`` when it is the file, else refused."""
    if size is None and want is None:
        size, want = _peek(client, url)
        if size is None and want is None:
            raise _in_the_way(target, "the server says neither its size nor its SHA-256, so "
                              "lokid cannot tell it is the same file")
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(e, f"cannot read {target}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _in_the_way(target, "it is not a regular file")
        if size is not None and st.st_size != size:
            raise _in_the_way(target, f"{st.st_size} bytes where the file has {size}")
        got = _hash_fd(fd, st.st_size, st.st_size, progress, chunk, target).hexdigest()
    finally:
        os.close(fd)
    if want is not None and got != want:
        raise _in_the_way(target, f"SHA-256 {got[:12]}… where the file's is {want[:12]}…")
    return Fetched(target, st.st_size, got, 0, True)


def _peek(client: httpx.Client, url: str) -> tuple[int | None, str | None]:
    """The size and SHA-256 the server's head announces for ``url`` (no body read)."""
    try:
        with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as r:
            fail = status_error(r, url, WHAT)
            if fail is not None:
                raise fail
            length = r.headers.get("content-length", "").strip()
            size = int(length) if r.status_code == 200 and length.isdigit() else None
            return size, _header_sha(r)
    except httpx.HTTPError as e:
        raise transport_error(e, url) from None


def _header_sha(r: httpx.Response) -> str | None:
    """The SHA-256 the hub's headers carry: ``X-Linked-Etag`` (on its redirect), else a
    64-hex ``ETag``."""
    for answer in (*r.history, r):
        sha = _etag_sha(answer.headers.get("x-linked-etag", ""))
        if sha is not None:
            return sha
    return _etag_sha(r.headers.get("etag", ""))


def _etag_sha(value: str) -> str | None:
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    return value.lower() if _HEX64.fullmatch(value) else None


def _hash_fd(fd: int, length: int, total: int | None, progress: Progress | None, chunk: int,
             path: str) -> hashlib._Hash:
    """The SHA-256 of the first ``length`` bytes of ``fd``."""
    hasher = hashlib.sha256()
    done = 0
    while done < length:
        try:
            data = os.pread(fd, min(chunk, length - done), done)
        except OSError as e:
            raise _os_error(e, f"cannot read {path}") from None
        if not data:
            raise PullError(f"{_p(path)} shrank while it was read: is another program "
                            "writing it?")
        hasher.update(data)
        done += len(data)
        if progress is not None:
            progress(done, total)
    return hasher


def _write(fd: int, data: bytes, offset: int, part: str) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view, offset)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"no space left for {_p(part)} (its file system or the "
                                   f"quota is full): {_amount(offset)} kept; free some space "
                                   "and pull again, it resumes") from None
            raise _os_error(e, f"cannot write {part}") from None
        view = view[n:]
        offset += n


def _truncate(fd: int, part: str) -> None:
    try:
        os.ftruncate(fd, 0)
    except OSError as e:
        raise _os_error(e, f"cannot truncate {part}") from None


def _room(directory: str, rest: int, reserve: int, target: str) -> None:
    """Refuse before the request when the rest of the file and ``reserve`` do not fit."""
    try:
        st = os.statvfs(directory)
    except OSError as e:
        raise _os_error(e, f"cannot check the free space of {directory}") from None
    free = st.f_bavail * st.f_frsize
    if free < rest + reserve:
        raise NoSpaceError(f"{_p(directory)} has {_amount(free)} free; "
                           f"{_p(os.path.basename(target))} needs {_amount(rest)} more, and "
                           f"{_amount(reserve)} is kept free: free some space and pull again")


def _in_the_way(target: str, why: str) -> PullError:
    return PullError(f"{_p(target)} exists and is not the file pulled ({why}): lokid never "
                     "overwrites a file it did not pull; move it away and pull again")


def _lie(url: str, part: str, said: int, size: int) -> HubError:
    return HubError(f"{_p(url)} announces {said} bytes where the listing says {size}: the "
                    f"mirror or the listing is wrong; {_p(part)} is kept")


def _os_error(e: OSError, what: str) -> PullError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"{_p(what)}: {e.strerror}; free some space and pull again")
    return PullError(f"{_p(what)}: {e.strerror}")


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(m.lastindex or 0)) if m is not None else None


def _kept(done: int, total: int | None) -> str:
    return f"{done} of {total} bytes" if total is not None else f"{done} bytes"


def _amount(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def _p(text: str) -> str:
    return printable(text[:500])
