"""``lokid pull-worker``: one model pull, run by the daemon in a unit of its own (issue 48).

The daemon starts it as a transient systemd unit (:mod:`lokid.dbus.pulls`: user loki, a
sandbox that can write the target directory and its status file only), or as its own child
where no system manager runs. It resolves the reference against the hub's file listing
(:mod:`lokid.core.model.pullref`), then fetches each file (:mod:`lokid.host.download`): resumable,
checked against the hub's SHA-256 before it is renamed into place.

Rules, each for the failure it prevents:

- **Progress goes to a status file and to systemd's STATUS=**: the daemon reads the file
  (it turns it into ``PullProgress`` signals for lokictl and the Cockpit page); an
  operator who looks with ``systemctl status`` sees the same words. The file is replaced
  atomically, at most every :data:`EVERY` seconds, so that a reader never sees half of it
  and a fast link does not turn into a disk-write loop.
- **A transient fault is retried here, not by a restart policy**: a cut connection, a hub
  answering 5xx or 429 waits (2 s doubling to a minute) and resumes where it stopped, up to
  ``retries`` tries without progress (a try that fetched bytes resets the count): a long
  download over a flaky link must not fail for one cut, and a dead mirror must not be asked
  for ever. The same rule runs under systemd and as a child.
- **The exit status says whether trying again can help**: 0 done (or stopped on request:
  the part is kept for a resume), :data:`EX_TEMPFAIL` a transient fault outlasted the
  retries, :data:`EX_CONFIG` it cannot succeed as asked (a reference naming nothing, a
  corrupt file, no room, no token for a gated model).
- **The token never reaches argv, the status file or a message**: it is read from the
  ``hf-token`` credential (``$CREDENTIALS_DIRECTORY``) that the unit's ``LoadCredential=``
  gives it.
- **The room for the whole pull is checked before the first byte**: a model of several
  shards must not fill the disk at shard three of four.
- **A manifest is written last** (``<dir>/.lokid-pulled/``, :mod:`lokid.core.model.pulled`): a
  preset naming the reference (``model = "org/repo:Q4_K_M"``) finds its files by it, and
  never before every file is in place.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import __version__
from ..core.errors import LokiError, NoSpaceError, PullError, printable
from ..core.model import pullref

EX_TEMPFAIL = 75
EX_CONFIG = 78
EVERY = 0.5            # s between two writes of the status file while bytes flow
TOKEN_CREDENTIAL = "hf-token"
RESERVE = 64 << 20     # bytes left free on the target's file system after a pull
MAX_STATUS = 64 << 10  # bytes of a status file read (its own are under 2 KiB)
# The states a status file says; the last three are final.
RESOLVING, FETCHING, WAITING, DONE, FAILED, STOPPED = (
    "resolving", "fetching", "waiting", "done", "failed", "stopped")
FINAL = frozenset({DONE, FAILED, STOPPED})


class Stopped(BaseException):
    """SIGTERM: the unit is being stopped (``lokictl pull --cancel``, a shutdown). Not an
    Exception: a handler for a failed read inside the download must not take it for one."""


@dataclass
class Status:
    """What the status file says; the daemon reads it back with :func:`read_status`."""

    reference: str
    directory: str
    state: str = RESOLVING
    done: int = 0
    total: int | None = None
    file: str = ""
    detail: str = ""
    model: str = ""
    files: list[str] = field(default_factory=list)
    pid: int = 0
    at: float = 0.0


def read_status(path: str) -> Status | None:
    """The status file at ``path``; None when it is missing, not one, or longer than
    :data:`MAX_STATUS` (never raises)."""
    try:
        with open(path, encoding="utf-8") as f:
            # bounded: the directory is the engines' user's too, and a file planted
            # there must not make the daemon (root) read gigabytes
            data = json.loads(f.read(MAX_STATUS))
        fields = {k: data[k] for k in Status.__dataclass_fields__ if k in data}
        status = Status(**fields)
    except (OSError, ValueError, TypeError):
        return None
    texts = (status.reference, status.directory, status.state, status.file, status.detail,
             status.model)
    if not all(isinstance(t, str) for t in texts) or not isinstance(status.done, int) \
            or not (status.total is None or isinstance(status.total, int)) \
            or not isinstance(status.files, list) \
            or not all(isinstance(f, str) for f in status.files):
        return None   # not the worker's: the daemon's signals and ListPulls carry types
    return status


class Reporter:
    """Writes the status file (atomically) and systemd's STATUS= line."""

    def __init__(self, path: str | None, status: Status, notify: Callable[[str], None]):
        self.path, self.status, self._notify = path, status, notify
        self._last = 0.0

    def update(self, force: bool = False, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        now = time.monotonic()
        if not force and now - self._last < EVERY:
            return
        self._last = now
        self.status.at = time.time()
        self._notify(describe(self.status))
        if self.path:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(asdict(self.status), f)
                os.replace(tmp, self.path)
            except OSError:
                pass   # progress is a courtesy: the pull itself goes on


def describe(s: Status) -> str:
    """One line for ``systemctl status`` and lokictl: what the pull does now."""
    if s.state == FETCHING:
        share = f" ({100 * s.done // s.total}%)" if s.total else ""
        return f"fetching {s.file}: {_size(s.done)} of {_size(s.total)}{share}"
    if s.state == DONE:
        return f"done: {', '.join(s.files)} in {s.directory}"
    return f"{s.state}: {s.detail}" if s.detail else s.state


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def read_token() -> str | None:
    """The hub token from the unit's ``hf-token`` credential; None without one."""
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not creds:
        return None
    try:
        with open(os.path.join(creds, TOKEN_CREDENTIAL), encoding="utf-8") as f:
            token = f.read(4096).strip()
    except OSError:
        return None
    return token or None


def _have(directory: str, name: str) -> int:
    """Bytes of ``name`` already in ``directory``: the whole file, or its part."""
    for path in (os.path.join(directory, name), os.path.join(directory, name + ".part")):
        try:
            return os.stat(path).st_size
        except OSError:
            continue
    return 0


def check_room(directory: str, plan: pullref.PullPlan) -> None:
    """NoSpaceError when the rest of the pull does not fit, with :data:`RESERVE` left."""
    sizes = [(f.name, f.size) for f in plan.files]
    if any(size is None for _, size in sizes):
        return   # a plain URL's size is learnt from its answer: download checks it then
    need = sum(max(0, (size or 0) - _have(directory, name)) for name, size in sizes)
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if need and free < need + RESERVE:
        raise NoSpaceError(
            f"{directory} has {_size(free)} free, and the rest of {plan.reference} needs "
            f"{_size(need)} (and {_size(RESERVE)} left free): free some space, or pull into "
            "another of model_dirs (lokictl pull --dir)")


class Worker:
    """One pull: ``resolve`` (the plan), then each file, with the retry rule above."""

    def __init__(self, reference: str, directory: str, reporter: Reporter, *,
                 endpoint: str, token: str | None, retries: int,
                 sleep: Callable[[float], None] = time.sleep):
        self.reference, self.directory, self.reporter = reference, directory, reporter
        self.endpoint, self.token, self.retries, self._sleep = endpoint, token, retries, sleep

    def run(self) -> int:
        try:
            ref = pullref.parse_reference(self.reference)
        except LokiError as e:
            self.reporter.update(force=True, state=FAILED, detail=str(e))
            return EX_CONFIG
        from ..host import hub

        # the token is the hub's: a URL elsewhere never gets it (the client sends it on
        # every request it makes itself; the hub's CDN redirects are cross-origin: dropped)
        token = self.token if not ref.url or _origin(ref.url) == _origin(self.endpoint) \
            else None
        client = hub.make_client(token, f"lokid/{__version__}")
        tries, delay = 0, 2.0
        try:
            while True:
                before = self.reporter.status.done
                try:
                    plan = self._resolve(client, ref)
                    self._fetch(client, plan)
                    _write_manifest(self.directory, plan)
                except PullError as e:
                    tries = 0 if self.reporter.status.done > before else tries + 1
                    if not e.retry:
                        self.reporter.update(force=True, state=FAILED, detail=str(e))
                        return EX_CONFIG
                    if tries >= self.retries:
                        self.reporter.update(force=True, state=FAILED,
                                             detail=f"{e} (gave up after {tries} tries)")
                        return EX_TEMPFAIL
                    delay = 2.0 if tries == 1 else min(60.0, delay * 2)
                    self.reporter.update(force=True, state=WAITING,
                                         detail=f"{e}; trying again in {delay:.0f} s")
                    self._sleep(delay)
                    continue
                except OSError as e:   # the directory vanished, a read-only remount
                    self.reporter.update(force=True, state=FAILED,
                                         detail=f"{self.directory}: {e.strerror or e}")
                    return EX_CONFIG
                self.reporter.update(force=True, state=DONE, detail="",
                                     files=[f.name for f in plan.files],
                                     model=plan.model_name)
                return 0
        except Stopped:
            kept = self.reporter.status.done
            self.reporter.update(force=True, state=STOPPED,
                                 detail=f"stopped; {_size(kept)} kept, pull again to resume")
            return 0
        finally:
            client.close()

    def _resolve(self, client: Any, ref: pullref.Reference) -> pullref.PullPlan:
        from ..host import hub

        self.reporter.update(force=True, state=RESOLVING, detail=f"listing {ref}")
        if ref.url:
            return pullref.url_plan(ref)
        assert ref.repo is not None
        entries = hub.list_entries(client, pullref.tree_url(self.endpoint, ref.repo,
                                                             ref.revision))
        return pullref.choose_files(ref, pullref.parse_listing(entries))

    def _fetch(self, client: Any, plan: pullref.PullPlan) -> None:
        from ..host.download import download

        check_room(self.directory, plan)
        self.reporter.update(force=True, total=plan.total, model=plan.model_name,
                             files=[f.name for f in plan.files])
        base = 0
        for f in plan.files:
            url = plan.reference.url or pullref.resolve_url(
                self.endpoint, plan.reference.repo or "", plan.reference.revision, f.path)

            def progress(done: int, total: int | None, base: int = base,
                         name: str = f.name) -> None:
                self.reporter.update(state=FETCHING, file=name, done=base + done,
                                     detail="")
            self.reporter.update(force=True, state=FETCHING, file=f.name, done=base)
            got = download(client, url, os.path.join(self.directory, f.name), size=f.size,
                           sha256=f.sha256, progress=progress, reserve=0)
            base += got.size
            self.reporter.update(force=True, done=base)


def main(reference: str, directory: str, status_path: str | None, retries: int) -> int:
    """``lokid pull-worker``: pull ``reference`` into ``directory``; the exit status above."""
    from ..host.notify import Notifier

    notifier = Notifier()

    def stop(*_: object) -> None:
        raise Stopped()

    signal.signal(signal.SIGTERM, stop)
    status = Status(reference=printable(reference), directory=directory, pid=os.getpid())
    reporter = Reporter(status_path, status, lambda text: notifier.send(f"STATUS={text}"))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        reporter.update(force=True, state=FAILED,
                        detail=f"cannot write {directory} as user {_user()}: make it the "
                               "loki user's (chown loki:loki), or pull into another directory")
        return EX_CONFIG
    try:
        endpoint = pullref.endpoint_from(os.environ.get("HF_ENDPOINT"))
    except LokiError as e:
        reporter.update(force=True, state=FAILED, detail=f"HF_ENDPOINT: {e}")
        return EX_CONFIG
    worker = Worker(reference, directory, reporter, endpoint=endpoint, token=read_token(),
                    retries=retries)
    return worker.run()


def _write_manifest(directory: str, plan: pullref.PullPlan) -> None:
    """What a preset naming this reference loads (:mod:`lokid.core.model.pulled`), written once
    every file is in place; a failure to write it is the pull's (the files alone would be
    a model no preset finds by its reference)."""
    from ..core.model import pulled

    mmproj = next((f.name for f in plan.files if f.role == "mmproj"), None)
    path = pulled.manifest_path(directory, str(plan.reference))
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(pulled.manifest_text(pulled.Pulled(str(plan.reference), plan.model_name,
                                                   mmproj)))
    os.replace(tmp, path)


def _origin(url: str) -> str:
    """scheme://host[:port] of ``url``, lowercased."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.lower()}://{rest.split('/', 1)[0].split('?', 1)[0].lower()}"


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
