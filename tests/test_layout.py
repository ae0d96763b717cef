"""The package's layout, drawn from its imports: no import circle, no module over 600
lines, and each sub-package saying who runs it and what it may import.

The graph is built with ``ast`` from every ``.py`` file under ``lokid/``: every import
counts, at the top of a module, inside a function or under ``if TYPE_CHECKING:``, since
each is an arrow a reader follows (and a lazy import only hides a circle until the day
it runs first). ``from pkg import name`` points at ``pkg.name`` when that is a module,
else at ``pkg`` itself. The layering between packages (which may import which) is
checked by tests/core/test_purity.py; here each package's own docstring is held to it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

import lokid

PACKAGE = Path(lokid.__file__).parent
MAX_LINES = 600


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(root: Path = PACKAGE) -> dict[str, tuple[str, bool]]:
    """Every module under ``root``: its dotted name -> (text, whether it is a package)."""
    return {module_name(p, root): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for p in sorted(root.rglob("*.py"))}


def graph(modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules of ``modules`` it imports (itself left out)."""
    edges: dict[str, set[str]] = {}
    for name, (text, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                for alias in node.names:
                    sub = f"{stem}.{alias.name}"
                    found.add(sub if sub in modules else stem)
        targets = set()
        for target in found:
            while target and target not in modules:   # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path that closes it (Tarjan's strongly connected
    components, iterative; a component of two or more modules holds a circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(_closing_path(sorted(component), edges))
    return found


def _closing_path(component: list[str], edges: Mapping[str, set[str]]) -> list[str]:
    """A readable circle inside ``component``: from its first module back to it."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(edges[node] & members):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return component


def test_no_import_circle() -> None:
    found = cycles(graph(sources()))
    assert found == [], "import circles: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize(("planted", "circle"), [
    ({"lokid.a": "from . import b\n", "lokid.b": "from .a import x\n"},
     ["lokid.a", "lokid.b", "lokid.a"]),
    # inside a function, and under TYPE_CHECKING: arrows all the same
    ({"lokid.a": "def f():\n    from .b import y\n",
      "lokid.b": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from lokid.c import z\n",
      "lokid.c": "import lokid.a\n"},
     ["lokid.a", "lokid.b", "lokid.c", "lokid.a"]),
    # a package whose __init__ imports the child that imports the package back
    ({"lokid.p": "from .q import x\n", "lokid.p.q": "from . import r\n",
      "lokid.p.r": "from .. import p\n"},
     ["lokid.p", "lokid.p.q", "lokid.p.r", "lokid.p"]),
])
def test_a_planted_circle_is_found(planted: dict[str, str], circle: list[str]) -> None:
    modules = {name: (text, any(other.startswith(name + ".") for other in planted))
               for name, text in planted.items()}
    assert cycles(graph(modules)) == [circle]


def test_imports_that_point_one_way_are_no_circle() -> None:
    modules = {"lokid.a": ("from . import b\nfrom .c import k\n", False),
               "lokid.b": ("from .c import k\n", False), "lokid.c": ("import os\n", False)}
    assert graph(modules)["lokid.a"] == {"lokid.b", "lokid.c"}
    assert cycles(graph(modules)) == []


def test_the_real_graph_sees_lazy_imports() -> None:
    """The daemon's local runner imports the unit's steps inside a function: that arrow is
    in the graph (if the graph missed lazy imports, the circle test would prove little)."""
    edges = graph(sources())
    assert "lokid.unit.steps" in edges["lokid.runners.local_runner"]
    assert "lokid.ctl.edit" in edges["lokid.ctl.main"]   # `from . import edit` in a function


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)}: {lines} lines"


SUBPACKAGES = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))
CORE = PACKAGE / "core"
CORE_TOPICS = sorted(p.parent for p in CORE.glob("*/__init__.py"))
# The core's root modules (errors, names, paths...): the words every topic shares.
CORE_ROOT = frozenset(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")


def undeclared_imports(name: str, doc: str, edges: Mapping[str, set[str]],
                       always: frozenset[str] = frozenset()) -> set[str]:
    """The packages beside ``name`` (its parent's children: the sub-packages of lokid, or
    the topics of lokid.core) that package ``name`` imports and its docstring's "May
    import:" sentence does not name. ``always``: children of the parent any may import."""
    parent, _, own = name.rpartition(".")
    depth = name.count(".")
    allowed = set(re.findall(rf":mod:`~?{re.escape(parent)}\.(\w+)",
                             doc.split("May import:", 1)[1]))
    imported = {target.split(".")[depth]
                for module, targets in edges.items()
                if module == name or module.startswith(name + ".")
                for target in targets
                if target.startswith(parent + ".") and target.count(".") >= depth}
    return imported - allowed - always - {own}


@pytest.mark.parametrize("package", SUBPACKAGES, ids=lambda p: p.name)
def test_each_subpackage_says_who_runs_it_and_what_it_may_import(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
    assert doc and "Who runs it:" in doc and "May import:" in doc, package.name
    name = module_name(package / "__init__.py")
    assert undeclared_imports(name, doc, graph(sources())) == set()


@pytest.mark.parametrize("package", CORE_TOPICS, ids=lambda p: p.name)
def test_each_core_topic_says_who_uses_it_and_which_topics_it_may_import(
        package: Path) -> None:
    """One level down: a topic of the core (lokid.core.config, .launch...) names the other
    topics it imports; the core's root modules are open to all."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
    assert doc and "Who uses it:" in doc and "May import:" in doc, package.name
    name = module_name(package / "__init__.py")
    assert undeclared_imports(name, doc, graph(sources()), CORE_ROOT) == set()


def test_the_core_has_topics_and_root_words() -> None:
    # A guard against the topic check passing on nothing: the topics and the shared words.
    assert {"config", "launch", "model", "serve", "telemetry", "bench", "place",
            "fleet"} <= {p.name for p in CORE_TOPICS}
    assert {"errors", "names", "paths"} <= CORE_ROOT


def test_a_topic_docstring_that_forgets_another_topic_is_caught() -> None:
    edges = {"lokid.core.launch": set(),
             "lokid.core.launch.plan": {"lokid.core.errors", "lokid.core.config.files",
                                        "lokid.core.model.modelinfo",
                                        "lokid.core.launch.flags", "lokid.store.state"},
             "lokid.core.model.modelinfo": {"lokid.core.serve.tables"}}
    doc = "Who uses it: x.\nMay import: :mod:`lokid.core.config`.\n"
    assert undeclared_imports("lokid.core.launch", doc, edges,
                              frozenset({"errors"})) == {"model"}
    # a root module not declared as always allowed counts like a topic
    assert undeclared_imports("lokid.core.launch", doc, edges) == {"model", "errors"}


def test_a_docstring_that_forgets_an_import_is_caught() -> None:
    edges = {"lokid.x": set(), "lokid.x.m": {"lokid.core.names", "lokid.dbus.daemon",
                                             "lokid.x.n"}}
    doc = "Who runs it: x.\nMay import: :mod:`lokid.core`.\n"
    assert undeclared_imports("lokid.x", doc, edges) == {"dbus"}


README = PACKAGE.parent / "docs" / "development.md"   # the layout table's home


def layout_rows(text: str) -> dict[str, str]:
    """docs/development.md's layout table: package path -> its row."""
    return {m.group(1): m.group(0)
            for m in re.finditer(r"^\| `(lokid/[\w./]+)` \|.*$", text, flags=re.M)}


def test_the_readme_layout_table_is_in_step_with_the_tree() -> None:
    rows = layout_rows(README.read_text(encoding="utf-8"))
    packages = {f"lokid/{p.name}/" for p in SUBPACKAGES}
    assert packages <= set(rows), \
        f"packages missing from docs/development.md: {packages - set(rows)}"
    for where, row in rows.items():
        assert (PACKAGE.parent / where).exists(), \
            f"docs/development.md names {where}, which is gone"
        if where.endswith("/"):
            for module in re.findall(r"`(\w+\.py)`", row):
                assert (PACKAGE.parent / where / module).exists(), f"{where}{module}"


def test_a_stale_readme_row_is_caught() -> None:
    rows = layout_rows("| `lokid/gone/` | x | `state.py` |\n| `lokid/core/` | y | z |\n")
    assert set(rows) == {"lokid/gone/", "lokid/core/"}
    assert not (PACKAGE.parent / "lokid/gone/").exists()


def test_no_test_module_imports_a_conftest_by_name() -> None:
    """``from conftest import X`` finds whichever conftest.py pytest imported last: with
    tests/cockpit/conftest.py collected before tests/core, make test stopped at
    collection. Shared helpers live in tests/support/."""
    tests = Path(__file__).resolve().parent
    found = [str(p.relative_to(tests)) for p in sorted(tests.rglob("*.py"))
             if re.search(r"^\s*(from conftest import|import conftest\b)", p.read_text(),
                          re.MULTILINE)]
    assert found == []
