"""What a model pull fetches (issue 48): the reference read, the hub's file listing read, and
the files chosen from it. Pure: :mod:`lokid.host.hub` asks the hub, :mod:`lokid.host.download`
writes the files; both take their URLs and names from here.

A reference is spelled as llama.cpp's ``-hf`` spells it, plus a file path and a URL:
``org/name``, ``org/name:Q4_K_M``, ``org/name@REV[:TAG]``, ``org/name/sub/file.gguf[@REV]``,
``https://host/dir/file.gguf``. The rules, each with the failure it prevents:

- names, revisions and paths are checked before any URL or file name is made from them:
  ``org/..`` or ``org/repo/../../etc/passwd.gguf`` must reach neither another place on
  the hub nor a file outside the models directory;
- every URL is built here with each segment percent-encoded: a file named with a space,
  ``#`` or ``?`` would otherwise ask for another file, or cut the URL at a fragment;
- a URL with ``user:password@`` is refused: the secret would be kept in the pull's unit,
  its log and ``lokictl status``; only http(s): ``file:`` would have the daemon (root)
  read a host file its caller may not read;
- a tag matches as a word that does not go on with a letter, a digit or ``_``: ``Q4_K``
  must not take ``Q4_K_M``, ``Q4_0`` not ``Q4_0_4_4``, ``F16`` not ``BF16``. Before the
  tag, ``_`` is a boundary (``model_Q4_K_M.gguf`` is a Q4_K_M file);
- among several matches, the one file whose own tag is the tag given wins: ``Q4_K_M``
  matches both ``x-Q4_K_M.gguf`` and ``x-UD-Q4_K_M.gguf``, and means the first;
- any other tie is refused with the names, never guessed: the wrong 40 GB file is an hour;
- a projector (``mmproj`` in its name) is never the model: it would be "the only F16 file"
  of an unsloth repository;
- a split GGUF comes whole or not at all: llama-server opens shard 1 and fails at the
  first shard missing, after the whole download;
- two chosen files with one base name are refused: the models directory is flat, and the
  second would overwrite the first;
- a listing not shaped as the hub's is refused whole (:class:`HubError`): a mirror's HTML
  page or a changed API must not become a plan of files of unknown size and digest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UNPRINTABLE, HubError, PullReferenceError, printable

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
# Tried in order when no tag is given: llama.cpp's -hf default, then the near-lossless one.
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
# A projector's precision when none matches the tag: full precision first (small, and
# llama.cpp's own projectors are F16), then what the quantised repositories offer.
MMPROJ_ORDER = ("F16", "BF16", "F32", "Q8_0")
MAX_NAMED = 10     # names listed in one error message
MAX_SHOWN = 200    # characters of the user's text repeated in one error message
MAX_REFERENCE = 2048

FORMS = ("use org/name, org/name:TAG (as org/name:Q4_K_M), org/name@REVISION[:TAG], "
         "org/name/path/file.gguf[@REVISION] or an https:// URL of a .gguf file")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,100}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_UNPRINTABLE = re.compile(UNPRINTABLE)
_SHARD = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf", re.IGNORECASE)
_HEX64 = re.compile(r"[0-9A-Fa-f]{64}")
# A quantisation named in a file name, to tell the user which tags a repository offers.
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d+(?:_[A-Za-z0-9]+)*|TQ\d_\d|B?F16|F32"
                    r"|MXFP4(?:_MOE)?))(?![A-Za-z0-9])", re.IGNORECASE)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_AUTHORITY = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::(\d{{1,5}}))?")
_URL = re.compile(r"(https?)://([^/?#]*)(/[^?#]*)(\?[^#]*)?(#.*)?", re.IGNORECASE | re.DOTALL)
_ENDPOINT = re.compile(r"(https?)://([^/?#]*)((?:/[A-Za-z0-9._~-]+)*)/?", re.IGNORECASE)
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@dataclass(frozen=True)
class Reference:
    repo: str | None        # "org/name" (None for a URL)
    tag: str | None         # quantisation tag as given ("Q4_K_M"), None if not given
    path: str | None        # a file inside the repo ("sub/x.gguf"), None if not given
    url: str | None         # an https:// or http:// URL of one file, else None
    revision: str = DEFAULT_REVISION

    def __str__(self) -> str:
        if self.url is not None:
            return self.url
        text = f"{self.repo}/{self.path}" if self.path is not None else str(self.repo)
        if self.revision != DEFAULT_REVISION:
            text += f"@{self.revision}"
        return text + (f":{self.tag}" if self.tag is not None else "")


@dataclass(frozen=True)
class HubFile:
    path: str            # path inside the repo
    size: int
    sha256: str | None   # lowercase hex, the LFS oid; None for a non-LFS file


@dataclass(frozen=True)
class PullFile:
    path: str            # path inside the repo (or the URL's path for a URL)
    name: str            # the file name it gets in the target directory (a safe basename)
    size: int | None
    sha256: str | None
    role: str            # "model" or "mmproj"


@dataclass(frozen=True)
class PullPlan:
    reference: Reference
    files: tuple[PullFile, ...]   # model shards in order first, then the mmproj if any

    @property
    def total(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(s for s in sizes if s is not None)

    @property
    def model_name(self) -> str:
        return self.files[0].name


def _shown(text: str) -> str:
    clipped = text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"
    return repr(printable(clipped))


def _refuse(text: str, why: str) -> PullReferenceError:
    return PullReferenceError(f"cannot read the model reference {_shown(text)}: {why}; {FORMS}")


def _path_problem(path: str) -> str | None:
    """Why ``path`` may not be a file inside a repository (None: it may)."""
    if _UNPRINTABLE.search(path):
        return "it holds a control character"
    if path.startswith("/") or "\\" in path:
        return "it starts with / or holds a backslash"
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        return "it has an empty, . or .. segment"
    if not path.lower().endswith(".gguf"):
        return "it does not end in .gguf"
    return None


def _name_problem(name: str) -> str | None:
    """Why ``name`` may not be a file's name in the models directory (None: it may)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return "it is empty, starts with . or holds a / or a backslash"
    if _UNPRINTABLE.search(name):
        return "it holds a control character"
    return None


def parse_reference(text: str) -> Reference:
    """The reference ``text`` read; :class:`PullReferenceError` names what is wrong in it."""
    given = text.strip()
    if not given:
        raise _refuse(text, "it is empty")
    if len(given) > MAX_REFERENCE:
        raise _refuse(given, f"it is longer than {MAX_REFERENCE} characters")
    if _UNPRINTABLE.search(given):
        raise _refuse(given, "it holds a control character")
    head = given.split("/", 1)[0]
    if ":" in head or given.lower().startswith(("http:", "https:")):
        return _url_reference(given)
    if given.lower().endswith(".gguf") and given.count("/") >= 2:
        rest, tag, revision = given, None, DEFAULT_REVISION   # ":" and "@" may be in a name
    else:
        rest, tag = given, None
        before, colon, after = given.rpartition(":")
        if colon and "/" not in after and "@" not in after:
            rest, tag = before, after
            if not _TAG.fullmatch(tag):
                raise _refuse(given, f"the tag {_shown(tag)} is not 1 to 64 of A-Z a-z 0-9 . _ -")
        rest, at, revision = rest.rpartition("@") if "@" in rest else (rest, "", DEFAULT_REVISION)
        if at and (not _REVISION.fullmatch(revision) or ".." in revision
                   or any(seg in ("", ".") for seg in revision.split("/"))):
            raise _refuse(given, f"the revision {_shown(revision)} is not a branch, a tag or a "
                                 "commit (1 to 100 of A-Z a-z 0-9 . _ - /, no .. and no empty "
                                 "segment)")
    parts = rest.split("/")
    if len(parts) < 2:
        raise _refuse(given, "a repository is named org/name")
    for name in parts[:2]:
        if not _NAME.fullmatch(name) or ".." in name:
            raise _refuse(given, f"{_shown(name)} is not a repository's org or name (1 to 96 "
                                 "of A-Z a-z 0-9 . _ -, starting with a letter or a digit, no ..)")
    repo = "/".join(parts[:2])
    if len(parts) == 2:
        return Reference(repo=repo, tag=tag, path=None, url=None, revision=revision)
    path = "/".join(parts[2:])
    problem = _path_problem(path)
    if problem:
        raise _refuse(given, f"the file path {_shown(path)} is not one lokid fetches: {problem}")
    if tag is not None:
        raise _refuse(given, "a tag does not go with a file path (the path names the file)")
    return Reference(repo=repo, tag=None, path=path, url=None, revision=revision)


def _unquote(segment: str) -> str | None:
    """``segment`` with its %XX escapes decoded (None: a bad escape, or not UTF-8)."""
    pieces = segment.split("%")
    out = bytearray(pieces[0].encode())
    for piece in pieces[1:]:
        if len(piece) < 2 or not all(c in "0123456789abcdefABCDEF" for c in piece[:2]):
            return None
        out += bytes.fromhex(piece[:2]) + piece[2:].encode()
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _authority_problem(authority: str) -> str | None:
    if "@" in authority:
        return "it carries a user name or password (give a token to lokid instead)"
    match = _AUTHORITY.fullmatch(authority)
    if not match or (match.group(1) is not None and not 0 < int(match.group(1)) < 65536):
        return f"{_shown(authority)} is not a host name with an optional port"
    return None


def _url_reference(given: str) -> Reference:
    _url_file(given)
    return Reference(repo=None, tag=None, path=None, url=given)


def _url_file(given: str) -> tuple[str, str]:
    """The path of the URL ``given`` and the name its file gets, once it is checked."""
    match = _URL.fullmatch(given)
    if not match:
        raise _refuse(given, "only https:// and http:// URLs of a file are fetched")
    if any(c.isspace() for c in given) or "\\" in given:
        raise _refuse(given, "a URL has no space or backslash (write a space as %20)")
    problem = _authority_problem(match.group(2))
    if problem:
        raise _refuse(given, problem)
    if match.group(5) is not None:
        raise _refuse(given, "a URL of a file has no #fragment")
    segments = [_unquote(seg) for seg in match.group(3).split("/")[1:]]
    if any(seg is None or seg in (".", "..") for seg in segments):
        raise _refuse(given, "its path has a bad %-escape or a . or .. segment")
    name = segments[-1] or ""
    problem = _name_problem(name) or (None if name.lower().endswith(".gguf")
                                      else "it does not end in .gguf")
    if problem:
        raise _refuse(given, f"its file name {_shown(name)} is not one lokid writes: {problem}")
    return match.group(3), name


def endpoint_from(value: str | None) -> str:
    """HF_ENDPOINT's ``value`` (None or blank: :data:`DEFAULT_ENDPOINT`), without a
    trailing ``/``; anything but ``http(s)://host[:port][/prefix]`` is refused."""
    if value is None or not value.strip():
        return DEFAULT_ENDPOINT
    match = _ENDPOINT.fullmatch(value.strip())
    problem = None if match else "it is not http(s)://host[:port][/prefix]"
    if match:
        problem = _authority_problem(match.group(2))
        if any(seg in (".", "..") for seg in match.group(3).split("/")):
            problem = "its prefix has a . or .. segment"
    if problem or not match:
        raise PullReferenceError(f"HF_ENDPOINT {_shown(value)} is not a hub's address: {problem};"
                                 f" use http(s)://host[:port][/prefix], as {DEFAULT_ENDPOINT}")
    return f"{match.group(1).lower()}://{match.group(2)}{match.group(3)}"


def _quote(segment: str) -> str:
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}"
                   for b in segment.encode("utf-8", "surrogatepass"))


def _quote_path(path: str) -> str:
    return "/".join(_quote(seg) for seg in path.split("/"))


def tree_url(endpoint: str, repo: str, revision: str) -> str:
    """The hub's recursive listing of ``repo`` at ``revision`` (a ``/`` in it encoded)."""
    return f"{endpoint}/api/models/{_quote_path(repo)}/tree/{_quote(revision)}?recursive=true"


def resolve_url(endpoint: str, repo: str, revision: str, path: str) -> str:
    """Where the hub serves ``path`` of ``repo`` at ``revision``."""
    return f"{endpoint}/{_quote_path(repo)}/resolve/{_quote(revision)}/{_quote_path(path)}"


def _malformed(why: str) -> HubError:
    return HubError(f"the hub's file listing is not what lokid reads: {why}; check HF_ENDPOINT "
                    "names a Hugging Face hub or a mirror of its API")


def _size(value: object) -> int | None:
    """``value`` if it is a whole number of bytes (None: it is not)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def parse_listing(entries: object) -> list[HubFile]:
    """The files of the hub's tree listing (JSON decoded); directories are left out."""
    if not isinstance(entries, list):
        raise _malformed(f"a {type(entries).__name__} where a list was expected")
    files = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise _malformed(f"entry {i} is not an object with a type")
        if entry["type"] != "file":
            continue    # a directory: its files are listed too (recursive=true)
        path, size, lfs = entry.get("path"), _size(entry.get("size")), entry.get("lfs")
        if not isinstance(path, str) or not path or size is None:
            raise _malformed(f"entry {i} has no path or no whole size")
        sha256 = None
        if lfs is not None:
            oid = lfs.get("oid") if isinstance(lfs, dict) else None
            size = _size(lfs.get("size")) if isinstance(lfs, dict) else None
            if not isinstance(oid, str) or not _HEX64.fullmatch(oid) or size is None:
                raise _malformed(f"the LFS fields of {_shown(path)} are not a SHA-256 and a size")
            sha256 = oid.lower()
        files.append(HubFile(path=path, size=size, sha256=sha256))
    return files


def _stem(path: str) -> str:
    """The base name of ``path`` without ``.gguf`` nor a shard's ``-0000k-of-0000N``."""
    base = path.rsplit("/", 1)[-1]
    shard = _SHARD.fullmatch(base)
    if shard:
        return shard.group(1)
    return base[:-5] if base.lower().endswith(".gguf") else base


def _bounded(tag: str, text: str) -> bool:
    """``tag`` is in ``text`` (any case) after no letter or digit, before no letter, digit, _."""
    t, s = tag.lower(), text.lower()
    start = s.find(t)
    while start >= 0:
        end = start + len(t)
        if ((start == 0 or s[start - 1] not in _ALNUM)
                and (end == len(s) or (s[end] not in _ALNUM and s[end] != "_"))):
            return True
        start = s.find(t, start + 1)
    return False


def _matches(tag: str, path: str) -> bool:
    """``tag`` names the file, or a directory it is in (``Q4_K_M/x-00001-of-00002.gguf``)."""
    return any(_bounded(tag, part) for part in (_stem(path), *path.split("/")[:-1]))


def _own_tag(path: str) -> str | None:
    """The quantisation the file's name says, else its nearest directory's."""
    for part in (_stem(path), *reversed(path.split("/")[:-1])):
        found = _QUANT.findall(part)
        if found:
            return str(found[-1]).upper()
    return None


@dataclass(frozen=True)
class _Unit:
    """One model or projector: a file, or the shards of one split GGUF listed (in order)."""
    files: tuple[HubFile, ...]
    label: str
    count: int = 1                    # shards the split has
    missing: tuple[int, ...] = ()     # shard numbers the listing lacks


def _units(files: list[HubFile]) -> list[_Unit]:
    units: list[_Unit] = []
    splits: dict[tuple[str, int], dict[int, HubFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        shard = _SHARD.fullmatch(f.path)
        if shard and 0 < int(shard.group(2)) <= int(shard.group(3)):
            key = (shard.group(1), int(shard.group(3)))
            splits.setdefault(key, {})[int(shard.group(2))] = f
        else:
            units.append(_Unit((f,), f.path))
    for (prefix, count), shards in splits.items():
        units.append(_Unit(tuple(shards[k] for k in sorted(shards)),
                           f"{prefix}-*-of-{count:05d}.gguf ({count} shards)", count,
                           tuple(k for k in range(1, count + 1) if k not in shards)))
    return sorted(units, key=lambda u: u.label)


def _whole(unit: _Unit, where: str) -> tuple[HubFile, ...]:
    if unit.missing:
        numbers = ", ".join(str(k) for k in unit.missing[:MAX_NAMED])
        raise PullReferenceError(
            f"{where}: {unit.label}: shard{'s' if len(unit.missing) > 1 else ''} {numbers} of "
            f"{unit.count} missing from the repository; a split model loads only whole, so "
            "nothing is fetched (pick another tag, or ask the repository's owner)")
    return unit.files


def _named(units: list[_Unit]) -> str:
    shown = ", ".join(printable(u.label) for u in units[:MAX_NAMED])
    return shown + (f" and {len(units) - MAX_NAMED} more" if len(units) > MAX_NAMED else "")


def _offered(units: list[_Unit]) -> str:
    tags = {_own_tag(u.files[0].path): u for u in units}
    untagged = [u for tag, u in tags.items() if tag is None]
    text = "tags offered: " + (", ".join(sorted(printable(t) for t in tags if t)) or "none")
    return text + (f"; files without a tag (pull them by path): {_named(untagged)}"
                   if untagged else "")


def _one(tag: str, found: list[_Unit], where: str, repo: str) -> _Unit:
    if len(found) == 1:
        return found[0]
    exact = [u for u in found if _own_tag(u.files[0].path) == tag.upper()]
    if len(exact) == 1:
        return exact[0]
    raise PullReferenceError(
        f"{where}: the tag {printable(tag)} names several models: {_named(found)}; "
        f"give a longer tag or the file's path ({repo}/PATH)")


def _model(ref: Reference, repo: str, units: list[_Unit], where: str) -> tuple[_Unit, str | None]:
    """The model unit a tag (or no tag) reference names, and the tag that named it."""
    if not units:
        raise PullReferenceError(f"{where} holds no GGUF model file (only projectors, or "
                                 "none): lokid pulls GGUF models only")
    if ref.tag is not None:
        found = [u for u in units if any(_matches(ref.tag, f.path) for f in u.files)]
        if not found:
            raise PullReferenceError(f"{where} has no model file for the tag "
                                     f"{printable(ref.tag)}; {_offered(units)}")
        return _one(ref.tag, found, where, repo), ref.tag
    for tag in DEFAULT_TAGS:
        found = [u for u in units if any(_matches(tag, f.path) for f in u.files)]
        if found:
            return _one(tag, found, where, repo), tag
    if len(units) == 1:
        return units[0], None
    raise PullReferenceError(f"{where} holds several models and no tag was given (neither "
                             f"{' nor '.join(DEFAULT_TAGS)} is among them); {_offered(units)}; "
                             f"pull one as {repo}:TAG")


def _projector(units: list[_Unit], tag: str | None) -> _Unit | None:
    """The projector for a model of ``tag``: the tag's, else by :data:`MMPROJ_ORDER`."""
    for want in ((tag,) if tag else ()) + MMPROJ_ORDER:
        for unit in units:
            if _matches(want, unit.files[0].path):
                return unit
    return units[0] if units else None


def _exact(path: str, files: list[HubFile], where: str) -> tuple[HubFile, ...]:
    """The file ``path`` names, with its sibling shards when it is one of a split."""
    ggufs = [f for f in files if f.path.lower().endswith(".gguf")]
    for unit in _units(ggufs):
        if any(f.path == path for f in unit.files):
            return _whole(unit, where)
    same = [f.path for f in ggufs if f.path.lower() == path.lower()]
    if same:   # the hub's paths are case-sensitive, and a file system's names too
        raise PullReferenceError(f"{where} has no file {printable(path)}; did you mean "
                                 f"{printable(same[0])}?")
    raise PullReferenceError(f"{where} has no file {printable(path)}; its GGUF files: "
                             f"{_named(_units(ggufs)) or 'none'}")


def _plan(ref: Reference, chosen: list[tuple[HubFile, str]], where: str) -> PullPlan:
    files: list[PullFile] = []
    for hub, role in chosen:
        name = hub.path.rsplit("/", 1)[-1]
        problem = _path_problem(hub.path) or _name_problem(name)
        if problem:
            raise HubError(f"{where}: the hub lists {_shown(hub.path)}, a file lokid will not "
                           f"write: {problem}")
        twin = next((f.path for f in files if f.name == name), None)
        if twin is not None:
            raise PullReferenceError(f"{where}: {printable(twin)} and {printable(hub.path)} "
                                     f"would both be {printable(name)} in the models directory")
        files.append(PullFile(hub.path, name, hub.size, hub.sha256, role))
    return PullPlan(ref, tuple(files))


def choose_files(ref: Reference, files: list[HubFile]) -> PullPlan:
    """What ``ref`` fetches of the repository's ``files`` (:func:`parse_listing`)."""
    if ref.url is not None:
        return url_plan(ref)
    if ref.repo is None:
        raise PullReferenceError(f"the reference {_shown(str(ref))} names no repository; {FORMS}")
    where = printable(ref.repo + ("" if ref.revision == DEFAULT_REVISION
                                  else f" at revision {ref.revision}"))
    if ref.path is not None:
        return _plan(ref, [(f, "model") for f in _exact(ref.path, files, where)], where)
    ggufs = [f for f in files if f.path.lower().endswith(".gguf")]
    projectors = [f for f in ggufs if "mmproj" in f.path.rsplit("/", 1)[-1].lower()]
    model, tag = _model(ref, ref.repo, _units([f for f in ggufs if f not in projectors]), where)
    chosen = [(f, "model") for f in _whole(model, where)]
    projector = _projector(_units(projectors), tag)
    if projector is not None:
        chosen += [(f, "mmproj") for f in _whole(projector, where)]
    return _plan(ref, chosen, where)


def url_plan(ref: Reference) -> PullPlan:
    """The one file a URL reference fetches; its size and digest are known only once it comes."""
    if ref.url is None:
        raise PullReferenceError(f"the reference {_shown(str(ref))} is not a URL; {FORMS}")
    path, name = _url_file(ref.url)   # a Reference made by hand meets parse_reference's rules
    return PullPlan(ref, (PullFile(path, name, None, None, "model"),))
