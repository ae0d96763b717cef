"""docs/reference.md checked against the code it describes (issue 49, item 3): a key, a
metric or a refusal added without its entry fails here, and an entry for something that
does not exist fails too.

- **config keys**: each table against the code's tuple of known keys (``PRESET_KEYS``,
  ``GATEWAY_KEYS`` ...), both ways. Each row's *example* is planted into a minimal real
  file in ``tmp_path`` and read by the real loader (an example the parser refuses is one
  an operator copies and gets an error from); its *type* by planting a value of another
  type (:data:`WRONG`) and expecting ConfigError; its *default*, where the parsed
  dataclass has a field of that name, is what a file without the key parses to
  (:func:`literal`), and ``required`` means a file without it is refused.
- **metrics**: names, types and labels from the real output of the two textfile
  renderers, fed records that reach every family they declare (a family not reached
  fails, so a new one cannot hide); alerts from the rules file by a regular expression
  (an alert line has one fixed shape; no YAML parser is a dependency).
- **refusals**: the gateway's (status, type, code) triples read from its source with
  :mod:`ast` (:func:`refusals_in_code`), names resolved through its module constants and
  imports; a call whose values cannot be resolved fails unless listed in :data:`DYNAMIC`
  with where its values are read instead.
- **man pages**: every ``lokictl`` sub-command and verb of its argparse parser is named
  in lokictl.1 (lokid's against lokid.8 is tests/packaging/test_docs.py's).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import REPO

from lokid.core.config import external
from lokid.core.config.files import (
    CHAT_KEYS,
    GLOBAL_KEYS,
    PRESET_KEYS,
    SPEC_KEYS,
    load_global,
    load_preset,
)
from lokid.core.errors import ConfigError
from lokid.core.fleet.peers import PEER_KEYS
from lokid.core.fleet.worker import WORKER_KEYS, parse_worker
from lokid.core.place.settings import PLACEMENT_KEYS
from lokid.core.serve.tables import GATEWAY_KEYS, SERVE_KEYS
from lokid.core.serve.usage import USAGE_KEYS
from lokid.watch import promfile, usageprom

DOC = REPO / "docs" / "reference.md"
GATEWAY_SOURCE = REPO / "lokid" / "gateway"
RULES = REPO / "data" / "prometheus" / "lokid.rules.yml"
LOKICTL_PAGE = REPO / "packaging" / "man" / "lokictl.1.rst"

# --- the Markdown -------------------------------------------------------------------

Row = dict[str, str]
CODE_SPAN = re.compile(r"`([^`]*)`")


def tables(text: str) -> dict[tuple[str, str], list[Row]]:
    """Every table of ``text`` by its (## heading, ### heading) ("" where none), each row
    a dict by the header's cells in lower case. A heading holds one table at most."""
    out: dict[tuple[str, str], list[Row]] = {}
    h2 = h3 = ""
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            h2, h3, header = line[3:].strip(), "", None
        elif line.startswith("### "):
            h3, header = line[4:].strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if header is None:
                header = [c.lower() for c in cells]
                assert (h2, h3) not in out, f"two tables under {h2} / {h3}"
                out[(h2, h3)] = []
            elif not all(set(c) <= set("-: ") for c in cells):
                assert len(cells) == len(header), f"{h2} / {h3}: {line!r} has {len(cells)} cells"
                out[(h2, h3)].append(dict(zip(header, cells, strict=True)))
        elif not line.strip():
            header = None
    return out


@pytest.fixture(scope="module")
def doc() -> dict[tuple[str, str], list[Row]]:
    return tables(DOC.read_text())


def span(cell: str) -> str:
    """The first code span of a cell (the key, the example, the name), "" for none."""
    m = CODE_SPAN.search(cell)
    return m.group(1) if m else ""


def spans(cell: str) -> set[str]:
    return set(CODE_SPAN.findall(cell))


def both_ways(documented: set[Any], real: set[Any], what: str) -> None:
    """``documented`` equals ``real``, the message naming what is missing and extra."""
    missing, extra = sorted(real - documented, key=str), sorted(documented - real, key=str)
    assert not missing and not extra, (
        f"{what}: not in docs/reference.md: {missing}; in docs/reference.md but not in the "
        f"code: {extra}")


# --- config tables ------------------------------------------------------------------

PRESETS, GLOBAL = "Preset keys", "lokid.toml keys"   # rpc/<name>.toml: under GLOBAL
# A TOML file as tables of literal values: "" is the top level, "peers" the first item
# of [gateway] peers (written inline: peers = [{ ... }]).
Doc = dict[str, dict[str, str]]

# The value of another type each documented type is checked with: the parser must refuse
# it. Every type refuses something, so none is skipped.
WRONG = {
    "string": "1",
    "integer": '"1"',
    "number": '"1"',
    "boolean": '"yes"',
    "span": "true",                    # a systemd span string, or seconds as a number
    "size": "true",                    # a systemd size string, or bytes as an integer
    "list of strings": "1",
    "list of tables": '"x"',
    "table": "1",
    "integer or string": "true",
    "list or string": "true",
    "string or integer": "true",
}
# Defaults that depend on another setting, written in words: checked by hand, not here.
CONTEXT_DEFAULTS = {("External preset", "upstream_model"), ("[gateway] peers", "name")}


@dataclass(frozen=True)
class Table:
    heading: str                       # the ### heading in docs/reference.md
    section: str                       # its ## heading
    keys: tuple[str, ...] | None       # the code's known keys (None: free names)
    file: str                          # "preset", "global" or "worker"
    where: str                         # the table of the file its keys are planted in
    minimal: Doc                       # the least a valid file holds (defaults read there)
    base: Doc = field(default_factory=dict)   # what the examples need beside them
    # where the parsed value's fields are looked for, in order
    objects: Callable[[Any], list[Any]] = lambda parsed: [parsed]


ENGINE: Doc = {"": {"model": '"m.gguf"'}}
EXTERNAL: Doc = {"": {"kind": '"external"', "url": '"http://127.0.0.1:9100/v1"'}}
NOTHING: Doc = {}
PEER: Doc = {"peers": {"url": '"http://gpu2:8000"'}}
RPC_MINIMAL: Doc = {"": {"listen": '"127.0.0.1:50052"'}}
RPC_BASE: Doc = {"": {"listen": '"10.0.0.2:50052"', "heads": '["10.0.0.1"]'}}

TABLES = (
    Table("Top level", PRESETS,
          tuple(k for k in PRESET_KEYS if k not in external.ONLY_EXTERNAL), "preset", "",
          ENGINE),
    Table("[spec]", PRESETS, SPEC_KEYS, "preset", "spec", ENGINE, objects=lambda p: [p.spec]),
    Table("[chat]", PRESETS, CHAT_KEYS, "preset", "chat", ENGINE, objects=lambda p: [p.chat]),
    Table("[serve]", PRESETS, SERVE_KEYS, "preset", "serve", ENGINE, objects=lambda p: [p.serve]),
    Table("[env]", PRESETS, None, "preset", "env", ENGINE, objects=lambda p: []),
    Table("[secrets]", PRESETS, None, "preset", "secrets", ENGINE, objects=lambda p: []),
    Table("External preset", PRESETS, external.EXTERNAL_KEYS, "preset", "", EXTERNAL,
          objects=lambda p: [p.external, p]),
    Table("Top level", GLOBAL, GLOBAL_KEYS, "global", "", NOTHING),
    Table("[gateway]", GLOBAL, GATEWAY_KEYS, "global", "gateway", NOTHING,
          objects=lambda g: [g.gateway]),
    Table("[gateway] peers", GLOBAL, PEER_KEYS, "global", "peers", PEER,
          objects=lambda g: [g.gateway.peers[0]]),
    Table("[placement]", GLOBAL, PLACEMENT_KEYS, "global", "placement", NOTHING,
          objects=lambda g: [g.placement]),
    Table("[usage]", GLOBAL, USAGE_KEYS, "global", "usage", NOTHING, objects=lambda g: [g.usage]),
    Table("rpc/<name>.toml", GLOBAL, WORKER_KEYS, "worker", "", RPC_MINIMAL, RPC_BASE),
)
IDS = [f"{t.file}:{t.heading}" for t in TABLES]


def render(doc: Doc) -> str:
    """``doc`` as TOML text: the top level, then a [table] each; ``peers`` as the one
    item of [gateway] peers."""
    lines = [f"{k} = {v}" for k, v in doc.get("", {}).items()]
    tables_ = {k: dict(v) for k, v in doc.items() if k not in ("", "peers")}
    if "peers" in doc:
        item = ", ".join(f"{k} = {v}" for k, v in doc["peers"].items())
        tables_.setdefault("gateway", {})["peers"] = f"[{{ {item} }}]"
    for name, values in tables_.items():
        lines += [f"[{name}]", *(f"{k} = {v}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def planted(base: Doc, where: str, key: str, value: str | None) -> Doc:
    """``base`` with ``key`` of table ``where`` set to ``value`` (None: removed)."""
    out = {name: dict(values) for name, values in base.items()}
    out.setdefault(where, {})
    if value is None:
        out[where].pop(key, None)
    else:
        out[where][key] = value
    return out


def with_base(table: Table) -> Doc:
    """``table``'s minimal file with what its examples need added."""
    out = {name: dict(values) for name, values in table.minimal.items()}
    for name, values in table.base.items():
        out.setdefault(name, {}).update(values)
    return out


def load(table: Table, doc: Doc, tmp_path: Path) -> Any:
    """``doc`` written where ``table``'s file lives under ``tmp_path`` and read by the real
    loader (ConfigError when it refuses it)."""
    text = render(doc)
    if table.file == "preset":
        (tmp_path / "presets").mkdir(exist_ok=True)
        (tmp_path / "presets" / "qwen.toml").write_text(text)
        return load_preset(str(tmp_path), "qwen")
    if table.file == "global":
        (tmp_path / "lokid.toml").write_text(text)
        return load_global(str(tmp_path))
    path = tmp_path / "rpc" / "gpu.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return parse_worker(path.read_text(), str(path), "gpu")


def rows_of(doc: Mapping[tuple[str, str], list[Row]], table: Table) -> list[Row]:
    found = doc.get((table.section, table.heading))
    assert found, f"docs/reference.md has no table under ## {table.section} / ### {table.heading}"
    return found


def literal(cell: str) -> tuple[str, Any]:
    """How a default cell reads: ``("value", v)`` for its first code span (``none`` is
    absent, else a TOML value: numbers, "quoted strings", true/false, [], {}),
    ``("required", None)`` for the word *required*, ``("words", None)`` otherwise."""
    if cell.strip().lower().startswith("required"):
        return "required", None
    text = span(cell)
    if text == "none":
        return "value", None
    if text:
        return "value", tomllib.loads(f"v = {text}")["v"]
    return "words", None


def same(parsed: Any, documented: Any) -> bool:
    """A parsed value equals a documented one (a tuple as a list, a mapping as a dict;
    a boolean only as a boolean: 1 is not true)."""
    if isinstance(parsed, bool) or isinstance(documented, bool):
        return parsed is documented
    if isinstance(parsed, tuple):
        parsed = list(parsed)
    if isinstance(parsed, Mapping):
        parsed = dict(parsed)
    return bool(parsed == documented)


def test_every_table_is_checked(doc: dict[tuple[str, str], list[Row]]) -> None:
    """A table of config keys in the reference that no Table above reads would go
    unchecked: every ### under the two config sections is one of TABLES."""
    known = {(t.section, t.heading) for t in TABLES}
    for h2, h3 in doc:
        if h2 in (PRESETS, GLOBAL):
            assert (h2, h3) in known, f"docs/reference.md: {h2} / {h3} is not checked"
    for rows in (doc[(t.section, t.heading)] for t in TABLES if (t.section, t.heading) in doc):
        assert list(rows[0]) == ["key", "type", "default", "example", "meaning"]


@pytest.mark.parametrize("table", TABLES, ids=IDS)
def test_the_keys_are_the_codes(doc: dict[tuple[str, str], list[Row]], table: Table) -> None:
    rows = rows_of(doc, table)
    keys = [span(r["key"]) for r in rows]
    assert len(keys) == len(set(keys)), f"{table.heading}: a key twice"
    if table.keys is None:   # [env], [secrets]: names are the operator's
        assert keys == ["NAME"]
        return
    both_ways(set(keys), set(table.keys), f"{table.section} / {table.heading}")


def test_every_preset_key_has_a_table(doc: dict[tuple[str, str], list[Row]]) -> None:
    """An engine preset's keys and an external one's together are every preset key."""
    documented = {span(r["key"]) for t in TABLES if t.file == "preset" and t.where == ""
                  for r in rows_of(doc, t)}
    both_ways(documented, set(PRESET_KEYS), "preset keys")


@pytest.mark.parametrize("table", TABLES, ids=IDS)
def test_each_example_parses(doc: dict[tuple[str, str], list[Row]], table: Table,
                             tmp_path: Path) -> None:
    base = with_base(table)
    for row in rows_of(doc, table):
        key, example = span(row["key"]), span(row["example"])
        assert example, f"{table.heading}: {key} has no example"
        try:
            load(table, planted(base, table.where, key, example), tmp_path)
        except ConfigError as e:
            pytest.fail(f"{table.heading}: the example {key} = {example} is refused: {e}")


@pytest.mark.parametrize("table", TABLES, ids=IDS)
def test_each_type_refuses_another(doc: dict[tuple[str, str], list[Row]], table: Table,
                                   tmp_path: Path) -> None:
    base = with_base(table)
    for row in rows_of(doc, table):
        key, kind = span(row["key"]), span(row["type"])
        assert kind in WRONG, f"{table.heading}: {key}: type {kind!r} is not one of {list(WRONG)}"
        with pytest.raises(ConfigError):
            load(table, planted(base, table.where, key, WRONG[kind]), tmp_path)
            pytest.fail(f"{table.heading}: {key} = {WRONG[kind]} was taken, but the "
                        f"reference says {kind}")


@pytest.mark.parametrize("table", TABLES, ids=IDS)
def test_each_default_is_what_a_file_without_it_gives(
        doc: dict[tuple[str, str], list[Row]], table: Table, tmp_path: Path) -> None:
    for row in rows_of(doc, table):
        key = span(row["key"])
        how, value = literal(row["default"])
        if how == "required":
            with pytest.raises(ConfigError):
                load(table, planted(table.minimal, table.where, key, None), tmp_path)
            continue
        parsed = load(table, planted(table.minimal, table.where, key, None), tmp_path)
        holders = [o for o in table.objects(parsed) if dataclasses.is_dataclass(o)
                   and key in {f.name for f in dataclasses.fields(o)}]
        if not holders:
            continue   # no field of that name (kind, gpu_count): nothing to compare with
        if (table.heading, key) in CONTEXT_DEFAULTS:
            assert how == "words", f"{table.heading}: {key}"
            continue
        if span(row["type"]) == "table" and how == "words":
            continue   # its own table's defaults are checked there
        assert how == "value", (f"{table.heading}: {key}'s default is not a value: "
                                f"{row['default']!r}")
        got = getattr(holders[0], key)
        assert same(got, value), f"{table.heading}: {key} defaults to {got!r}, documented {value!r}"


# --- metrics ------------------------------------------------------------------------

METRICS = "Prometheus metrics"
SAMPLE = re.compile(r"^(?P<name>lokid_[a-z_]+?)(?:_sum|_count)?(?:\{(?P<labels>[^}]*)\})? ")


def rendered() -> str:
    """Both textfiles, for records that make every declared family appear."""
    stats = {"started": 1.0, "load_seconds": 2.5, "requests": 3, "in_flight": 1,
             "missed_lines": 0, "prompt_tokens": 10, "generated_tokens": 20,
             "prefill_tps": {"1m": 100.0}, "decode_tps": {"1m": 20.0},
             "draft": {"kind": "mtp", "generated": 4, "accepted": 3},
             "memory_mib": {"CUDA0 model": 100}, "offload": ["33/33", "1/1"]}
    sight = {"cold_starts": 1, "cold_start_waits": 1, "cold_start_wait_seconds": 2.0,
             "gateway_requests": {"200": 3}, "evictions": {"room": 1}}
    memory = {"needs": {"GPU0": 1 << 30}, "sources": {"GPU0": "nvml"}}
    records = [promfile.Record("qwen", "q.gguf", "ready", stats, "", 1, 0, sight, memory),
               promfile.Record("qwen", "q.gguf", "ready", stats, "", 1, 0, sight, memory, 2)]
    daemon = promfile.render(
        records, 1.0e9, broken=["bad"], swaps={"gpu0": 1}, waits=["qwen"],
        devices=[{"device": "GPU0", "total": 8, "free": 4, "reserve": 1, "lokid": 2,
                  "others": 1}], peers={"gpu2": ""})
    usage = usageprom.render({("alice", "qwen"): {"requests": 2, "prompt_tokens": 5,
                                                  "refused_429": 1, "wait_ms": 10,
                                                  "engine_ms": 20}})
    return daemon + usage


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """Each family of a textfile: its TYPE and the labels its samples carry."""
    out: dict[str, tuple[str, set[str]]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            out[name] = (kind, set())
        elif not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            labels = re.findall(r'([a-z_]+)="', m.group("labels") or "")
            out[m.group("name")][1].update(labels)
    return out


def test_the_renderers_write_every_family_they_declare() -> None:
    """The input above reaches every family: a new family it does not reach fails here
    (extend the input), so that the comparison below sees it."""
    declared = {*promfile.FAMILY_NAMES, *(name for name, _ in usageprom.FAMILIES)}
    both_ways(set(families(rendered())), declared, "rendered vs declared families")


def test_the_metrics_are_the_codes(doc: dict[tuple[str, str], list[Row]]) -> None:
    real = families(rendered())
    rows = {span(r["name"]): r for r in doc[(METRICS, "")]}
    both_ways(set(rows), set(real), "metrics")
    for name, (kind, labels) in real.items():
        assert rows[name]["type"] == kind, f"{name} is a {kind}"
        both_ways(spans(rows[name]["labels"]), labels, f"labels of {name}")


def test_the_alerts_are_the_rules(doc: dict[tuple[str, str], list[Row]]) -> None:
    text = RULES.read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)\s*$", text, re.M))
    assert len(alerts) >= 5
    both_ways({span(r["alert"]) for r in doc[(METRICS, "Alerts")]}, alerts, "alerts")
    documented = {span(r["name"]) for r in doc[(METRICS, "")]}
    assert set(re.findall(r"\blokid_[a-z_]+", text)) <= documented


# --- the gateway's refusals ---------------------------------------------------------

REFUSALS = "The gateway's refusals"
INVALID = "invalid_request_error"
ArgSpec = tuple[int | None, str | None, Any]   # position, keyword, value when absent
NEEDED = object()
# Where each refusal-making call holds its status, type and code.
SHAPES: dict[str, tuple[ArgSpec, ArgSpec, ArgSpec]] = {
    "GatewayError": ((0, "status", NEEDED), (2, "kind", INVALID), (3, "code", None)),
    # re-raised by the server as GatewayError(e.status, str(e), code=e.code): the type is
    # GatewayError's default
    "BodyError": ((0, "status", NEEDED), (None, None, INVALID), (2, "code", NEEDED)),
    "LimitReached": ((None, None, 429), (1, "kind", NEEDED), (2, "code", NEEDED)),
    # status: the status= of the response it is the body of, the "HTTP/1.1 NNN" its
    # function writes, or "stream" (an event of a stream already answered 200)
    "error_body": ((None, "status", NEEDED), (1, "kind", NEEDED), (2, "code", NEEDED)),
}
# Calls whose values are not literals, and where the values come from instead.
DYNAMIC = {
    ("replies", "GatewayError.body"),    # the body of each GatewayError (its calls are read)
    ("server", "Gateway._scan"),                 # a BodyError re-raised (its calls are read)
    ("server", "Gateway._form"),                 # the same, for a form
    ("limits", "LimitReached.__init__"),  # kind and code are LimitReached's own arguments
}


class Unresolved(Exception):
    pass


def gateway_modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(GATEWAY_SOURCE.glob("*.py"))}


def resolve(mods: dict[str, ast.Module], mod: str, node: ast.expr) -> set[Any]:
    """The values ``node`` may have: a literal, a module constant (through the gateway's
    own imports), either branch of ``a if c else b``; Unresolved otherwise."""
    if isinstance(node, ast.Constant):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return resolve(mods, mod, node.body) | resolve(mods, mod, node.orelse)
    if isinstance(node, ast.Name):
        for n in mods[mod].body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id
                                                 for t in n.targets):
                return resolve(mods, mod, n.value)
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module in mods:
                for a in n.names:
                    if (a.asname or a.name) == node.id:
                        return resolve(mods, n.module, ast.Name(a.name))
    raise Unresolved(ast.unparse(node))


def argument(call: ast.Call, spec: ArgSpec) -> ast.expr | None:
    pos, kw, _ = spec
    if pos is not None and pos < len(call.args):
        return call.args[pos]
    return next((k.value for k in call.keywords if kw is not None and k.arg == kw), None)


def calls(tree: ast.AST, scope: str = "", source: str = "", outer: ast.Call | None = None
          ) -> Iterator[tuple[ast.Call, str, str, ast.Call | None]]:
    """Each call with the qualified name of the function it is in (``Class.method``), that
    function's source, and the call it is an argument of."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = f"{scope}.{child.name}".lstrip(".")
            yield from calls(child, inner, source if isinstance(child, ast.ClassDef)
                             else ast.unparse(child))
        elif isinstance(child, ast.Call):
            yield child, scope, source, outer
            yield from calls(child, scope, source, child)
        else:
            yield from calls(child, scope, source, outer)


def status_around(mods: dict[str, ast.Module], mod: str, scope: str, source: str,
                  outer: ast.Call | None) -> set[Any]:
    """An ``error_body``'s status: the ``status=`` of the response it is the body of, the
    ``HTTP/1.1 NNN`` its function writes, or "stream" in a function named ``sse...``."""
    if outer is not None:
        node = next((k.value for k in outer.keywords if k.arg == "status"), None)
        if node is not None:
            return resolve(mods, mod, node)
    written = re.search(r"HTTP/1\.1 (\d{3}) ", source)
    if written:
        return {int(written.group(1))}
    if scope.rsplit(".", 1)[-1].startswith("sse"):
        return {"stream"}
    raise Unresolved("status")


def refusals_in_code() -> set[tuple[str, str, str | None]]:
    """Every (status, type, code) the gateway's source can answer with."""
    mods = gateway_modules()
    bases = {n.name: {ast.unparse(b) for b in n.bases}
             for tree in mods.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    out: set[tuple[str, str, str | None]] = set()
    for mod, tree in mods.items():
        for call, scope, source, outer in calls(tree):
            func = call.func
            name = func.id if isinstance(func, ast.Name) else ""
            if (isinstance(func, ast.Attribute) and func.attr == "__init__"
                    and ast.unparse(func.value) == "super()"):
                name = next((b for b in bases.get(scope.rsplit(".", 1)[0], ()) if b in SHAPES),
                            "")
            if name not in SHAPES:
                continue
            try:
                values: list[set[Any]] = []
                for i, spec in enumerate(SHAPES[name]):
                    node = argument(call, spec)
                    if node is not None:
                        values.append(resolve(mods, mod, node))
                    elif name == "error_body" and i == 0:
                        values.append(status_around(mods, mod, scope, source, outer))
                    elif spec[2] is NEEDED:
                        raise Unresolved(f"no {spec[1]}")
                    else:
                        values.append({spec[2]})
            except Unresolved as e:
                assert (mod, scope) in DYNAMIC, (
                    f"lokid/gateway/{mod}.py, {scope}: a refusal whose {e} is not a literal "
                    "or a constant: document what it answers, and add it to DYNAMIC saying "
                    "where its values are read instead")
                continue
            out |= {(str(s), k, c) for s in values[0] for k in values[1] for c in values[2]}
    return out


def test_the_extractor_sees_the_known_refusals() -> None:
    """The reader above finds refusals of each shape (a reader that found nothing would
    make the comparison below pass on an empty table)."""
    found = refusals_in_code()
    assert ("401", "authentication_error", "invalid_api_key") in found      # GatewayError
    assert ("400", INVALID, "invalid_json") in found                        # BodyError
    assert ("429", "tokens", "rate_limit_exceeded") in found                # LimitReached
    assert ("429", "requests", "rate_limit_exceeded") in found              # super().__init__
    assert ("403", "permission_error", "origin_not_allowed") in found       # status=
    assert ("408", INVALID, "request_timeout") in found                     # HTTP/1.1 408
    assert ("stream", "server_error", "upstream_failed") in found           # sse_error


def test_the_refusals_are_the_codes(doc: dict[tuple[str, str], list[Row]]) -> None:
    rows = doc[(REFUSALS, "")]
    documented = {(span(r["status"]), span(r["type"]), span(r["code"]) or None) for r in rows}
    assert all(r["when"] for r in rows)
    both_ways(documented, refusals_in_code(), "the gateway's refusals (status, type, code)")


# --- man pages, pointers ------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name
                yield from subcommands(sub)


def test_every_lokictl_command_has_its_man_entry() -> None:
    from lokid.ctl.main import _parser

    text = LOKICTL_PAGE.read_text()
    names = set(subcommands(_parser()))
    assert {"status", "keys", "rotate", "replica"} <= names
    missing = sorted(n for n in names if f"**{n}**" not in text)
    assert not missing, f"lokictl.1 names no {missing}"


def test_the_pointers_name_files_that_exist() -> None:
    text = DOC.read_text()
    pointers = text.split("## Elsewhere", 1)[1]
    paths = [p for p in CODE_SPAN.findall(pointers) if "/" in p and " " not in p]
    assert paths
    for p in paths:
        assert (REPO / p).exists(), p


def test_readme_points_here() -> None:
    assert "(docs/reference.md)" in (REPO / "README.md").read_text()
