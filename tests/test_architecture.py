"""The walls of shared/DESIGN.md, held by walking every module's imports.

- backend/ never reaches torch or the training code (workers/);
- code that runs inside the ranks (workers/harness, workers/strategies) never reaches the web
  app, the database, FastAPI or Celery;
- the domain core (parallab/core) reaches only the standard library and pydantic;
- figure builders (backend/figures) never reach the database or HTTP;
- one strategy module never imports another (the rank side's `compose` aside; the packages'
  registries and their shared base modules are not strategies), and one dimension module never
  imports another;
- no strategy or dimension name is compared as a string outside its own descriptor and rank
  module (capability facts live on the descriptors, not in `if name == ...` elsewhere);
- no engine module (workers/engines) reaches the database: it never opens a session, the
  coordinator's ledger does;
- the run coordinator (workers/coordinator) reaches no backend module, the database or Celery: it
  speaks to the database through the ledger's interface (parallab.core.ledger), and its drivers
  wire the implementation in;
- no engine class is named outside its own module, the engine registry
  (workers.engines.registry) and the drivers the registry lists for it;
- no import cycle among the repo's modules.

Imports are read with `ast`, never executed: module-level and function-level alike (an import
inside a function still runs when the function does), but not those under `if TYPE_CHECKING:`,
which never run. "Reaches" follows imports through the repo's own modules, and counts the
packages whose `__init__` an import runs. The checker itself is tested on small synthetic
trees, one per wall, so each rule is known to be able to fail.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist", "venv", "site-packages"}
STDLIB = frozenset(sys.stdlib_module_names)
CORE_MAY_USE = frozenset({"pydantic", "pydantic_core", "annotated_types", "typing_extensions"})
STRATEGY_PACKAGES = ("parallab.core.strategies", "workers.strategies", "parallab.core.dims")
COMPOSER = "compose"
SHARED_STRATEGY_MODULES = frozenset({"base", "layout"})
"""Modules of a strategy package that every strategy may import (not strategies themselves)."""


# ---- reading imports ----


@dataclass(frozen=True)
class Statement:
    """One import statement: `import base` (names empty) or `from base import names`."""

    base: str
    names: tuple[str, ...]
    line: int


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: all of them but the body of an `if TYPE_CHECKING:` (its else runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _runtime_nodes(stmt)
        else:
            yield child
            yield from _runtime_nodes(child)


def _absolute(name: str | None, level: int, module: str, is_package: bool) -> str:
    """The absolute module a (possibly relative) from-import names."""
    if not level:
        return name or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


def statements(source: str, module: str, *, is_package: bool = False) -> list[Statement]:
    out = []
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Statement(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names if a.name != "*")
            out.append(Statement(_absolute(node.module, node.level, module, is_package), names, node.lineno))
    return out


# ---- the graph ----


class ImportGraph:
    """Which module imports what: repo modules by full name, anything else by its top-level package."""

    def __init__(self, sources: Mapping[str, tuple[str, bool]]):
        """`sources`: module name → (its source, whether it is a package's __init__)."""
        self.modules = frozenset(sources)
        self.roots = frozenset(m.split(".")[0] for m in self.modules)
        self._statements = {m: statements(src, m, is_package=pkg) for m, (src, pkg) in sources.items()}
        self.sources = {m: src for m, (src, _pkg) in sources.items()}

    @classmethod
    def of_tree(cls, root: Path) -> ImportGraph:
        sources = {}
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") or part in SKIP_DIRS for part in rel.parts[:-1]):
                continue
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            if parts:
                sources[".".join(parts)] = (path.read_text(), is_package)
        return cls(sources)

    @classmethod
    def of(cls, sources: Mapping[str, str]) -> ImportGraph:
        """A synthetic tree: `{"pkg.__init__": "...", "pkg.mod": "import x"}`."""
        return cls({k.removesuffix(".__init__"): (src, k.endswith(".__init__")) for k, src in sources.items()})

    def _owner(self, name: str) -> str:
        """The longest prefix of `name` that is a repo module (`name` itself if none is)."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in self.modules:
                return ".".join(parts[:i])
        return name

    def imports(self, module: str) -> set[str]:
        """What `module` imports: the repo module each statement names (`from pkg import mod` names
        pkg.mod), or the top-level package outside the repo."""
        out: set[str] = set()
        for st in self._statements[module]:
            root = st.base.split(".")[0]
            if root not in self.roots:
                out.add(root)
                continue
            submodules = [f"{st.base}.{n}" for n in st.names if f"{st.base}.{n}" in self.modules]
            out.update(submodules)
            if not st.names or len(submodules) < len(st.names):
                out.add(self._owner(st.base))
        out.discard(module)
        return out

    def runs(self, module: str) -> set[str]:
        """What importing `module` runs directly: its imports, and the packages above each repo one."""
        out = set()
        for target in self.imports(module):
            out.add(target)
            if target in self.modules:
                parts = target.split(".")
                out.update(p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in self.modules)
        out.discard(module)
        return out

    def breaches(self, scope: Callable[[str], bool], forbidden: Callable[[str], bool]) -> list[str]:
        """Every import by which a module in `scope` reaches something `forbidden`, with one path."""
        found: dict[tuple[str, str], list[str]] = {}
        for start in sorted(m for m in self.modules if scope(m)):
            parent: dict[str, str | None] = {start: None}
            queue = deque([start])
            while queue:
                module = queue.popleft()
                named = {t for t in self.imports(module) if forbidden(t)}
                for target in sorted(self.runs(module)):
                    if target in parent:
                        continue
                    parent[target] = module
                    if forbidden(target):
                        if target not in named and any(t.startswith(target + ".") for t in named):
                            continue  # a package above a forbidden import: that import says it
                        path = [target]
                        while (up := parent[path[-1]]) is not None:
                            path.append(up)
                        found.setdefault((module, target), path[::-1])
                    elif target in self.modules:
                        queue.append(target)
        return [f"{m} imports {t} (reached from {' → '.join(path)})" for (m, t), path in sorted(found.items())]

    def cycles(self) -> list[list[str]]:
        """Strongly connected groups of more than one module (Tarjan), each sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(t for t in self.imports(v) if t in self.modules):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * len(self.modules) + 100))
        try:
            for v in sorted(self.modules):
                if v not in index:
                    visit(v)
        finally:
            sys.setrecursionlimit(limit)
        return sorted(out)


# ---- the walls ----


def _under(*prefixes: str) -> Callable[[str], bool]:
    return lambda name: any(name == p or name.startswith(p + ".") for p in prefixes)


def backend_wall(g: ImportGraph) -> list[str]:
    """backend/ never reaches torch or the training code."""
    return g.breaches(_under("backend"), _under("torch", "workers"))


def rank_wall(g: ImportGraph) -> list[str]:
    """Code that runs in the ranks never reaches the web app, the database, FastAPI or Celery."""
    return g.breaches(_under("workers.harness", "workers.strategies"), _under("backend", "sqlalchemy", "fastapi", "starlette", "celery"))


def core_wall(g: ImportGraph) -> list[str]:
    """The core reaches only the standard library, pydantic and itself (and the packages above it)."""
    allowed_repo = _under("parallab.core")

    def forbidden(name: str) -> bool:
        if name in g.modules:
            return not (allowed_repo(name) or name == "parallab")
        return name not in STDLIB and name not in CORE_MAY_USE

    return g.breaches(allowed_repo, forbidden)


def figures_wall(g: ImportGraph) -> list[str]:
    """Figure builders never reach the database or HTTP."""
    return g.breaches(
        _under("backend.figures"), _under("sqlalchemy", "fastapi", "starlette", "httpx", "backend.db", "backend.models", "backend.store")
    )


def strategy_wall(g: ImportGraph) -> list[str]:
    """No strategy (or dimension) module imports another; only the rank side's composer does."""
    out = []
    for package in STRATEGY_PACKAGES:
        members = {m for m in g.modules if m.rpartition(".")[0] == package}
        strategies = {m for m in members if m.rpartition(".")[2] not in SHARED_STRATEGY_MODULES}
        for module in sorted(members):
            if module.rpartition(".")[2] == COMPOSER:
                continue
            out += [f"{module} imports {t}" for t in sorted(g.imports(module) & strategies)]
    return out


def _string_constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _string_constants(e)]
    return []


def name_comparisons(
    g: ImportGraph, owners: Mapping[str, frozenset[str]], *, under: tuple[str, ...] = ("parallab", "backend", "workers")
) -> list[str]:
    """Comparisons (==, !=, in, ...) of a string constant that is a strategy or dimension name
    (`owners`: name → the modules that may compare it), outside those modules."""
    out = []
    for module in sorted(m for m in g.modules if m.split(".")[0] in under):
        for node in ast.walk(ast.parse(g.sources[module])):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                for name in _string_constants(side):
                    if name in owners and module not in owners[name]:
                        out.append(f"{module}:{node.lineno} compares {name!r}")
    return out


def name_owners() -> dict[str, frozenset[str]]:
    """Each strategy name → its descriptor's and rank module's names; each dimension name → its
    descriptor, the layout that declares it and the rank-side composition."""
    from parallab.core.dims import DIMENSIONS
    from parallab.core.strategies import REGISTRY
    from workers.strategies import MODULES

    out = {
        name: frozenset({type(d).__module__, *([f"workers.strategies.{MODULES[name]}"] if name in MODULES else [])})
        for name, d in REGISTRY.items()
    }
    for name, dim in DIMENSIONS.items():
        out[name] = out.get(name, frozenset()) | {type(dim).__module__, "parallab.core.layout", "workers.strategies.compose"}
    return out


DATABASE = ("backend.db", "backend.store", "backend.models", "backend.services", "sqlalchemy")


def engine_wall(g: ImportGraph) -> list[str]:
    """No engine module reaches the database (a session, the store, the services that open them)."""
    return g.breaches(_under("workers.engines"), _under(*DATABASE))


def coordinator_wall(g: ImportGraph) -> list[str]:
    """The run coordinator reaches no backend module, the database or Celery: only the ledger's interface."""
    return g.breaches(_under("workers.coordinator"), _under("backend", "sqlalchemy", "celery"))


def _named(source: str) -> set[str]:
    """Every identifier a module's code names (names, attributes, imported names)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.rpartition(".")[2])
    return out


def engine_names(
    g: ImportGraph, engines: Mapping[str, frozenset[str]], *, registry: str, under: tuple[str, ...] = ("parallab", "backend", "workers")
) -> list[str]:
    """Modules that name an engine class (`engines`: class name → the modules that may: its own
    and its drivers'), the registry aside."""
    out = []
    for module in sorted(m for m in g.modules if m.split(".")[0] in under and m != registry):
        for name in sorted(_named(g.sources[module]) & set(engines)):
            if module not in engines[name]:
                out.append(f"{module} names engine {name}")
    return out


def engine_classes() -> dict[str, frozenset[str]]:
    """Each registered engine class's name → its module and its drivers'."""
    from workers.engines.registry import ENGINES

    return {kind.engine.__name__: frozenset({kind.engine.__module__, *kind.drivers}) for kind in ENGINES.values()}


def cycle_wall(g: ImportGraph) -> list[str]:
    """No import cycle among the repo's modules."""
    return [" ↔ ".join(group) for group in g.cycles()]


WALLS: dict[str, Callable[[ImportGraph], list[str]]] = {
    "backend never reaches torch or workers": backend_wall,
    "rank code never reaches backend, the database, FastAPI or Celery": rank_wall,
    "the core reaches only the standard library and pydantic": core_wall,
    "figures never reach the database or HTTP": figures_wall,
    "strategies never import each other (compose aside)": strategy_wall,
    "no strategy or dimension name is compared outside its own modules": lambda g: name_comparisons(g, name_owners()),
    "no engine module reaches the database": engine_wall,
    "the run coordinator reaches no backend module, the database or Celery": coordinator_wall,
    "no engine is named outside its own module, its drivers and the registry": lambda g: engine_names(
        g, engine_classes(), registry="workers.engines.registry"
    ),
    "no import cycles": cycle_wall,
}


# ---- the repo holds every wall ----


@pytest.fixture(scope="module")
def repo() -> ImportGraph:
    return ImportGraph.of_tree(REPO)


def test_the_walk_sees_the_whole_repo(repo: ImportGraph):
    for module in (
        "parallab.core.jobs",
        "parallab.core.strategies.hybrid",
        "backend.api.app",
        "workers.harness.main",
        "tests.test_architecture",
    ):
        assert module in repo.modules
    assert {"parallab.core.model", "parallab.core.strategies"} <= repo.imports("parallab.core.spec")


@pytest.mark.parametrize("wall", list(WALLS))
def test_the_repo_holds_the_wall(repo: ImportGraph, wall: str):
    violations = WALLS[wall](repo)
    assert not violations, f"{wall}:\n  " + "\n  ".join(violations)


# ---- each wall can fail ----


def test_backend_reaching_torch_or_workers_is_caught_directly_in_functions_and_through_other_modules():
    ok = {"backend.__init__": "", "backend.api": "import json\nfrom backend import util", "backend.util": "import sqlalchemy"}
    assert backend_wall(ImportGraph.of(ok)) == []
    direct = ImportGraph.of({**ok, "backend.api": "import torch.nn"})
    assert backend_wall(direct) == ["backend.api imports torch (reached from backend.api → torch)"]
    in_function = ImportGraph.of(
        {**ok, "backend.util": "def f():\n    from workers.celery_app import app\n", "workers.__init__": "", "workers.celery_app": ""}
    )
    assert "backend.util imports workers" in "\n".join(backend_wall(in_function))
    through = ImportGraph.of({**ok, "backend.util": "from . import helper", "backend.helper": "import torch"})
    assert backend_wall(through)[0].startswith("backend.helper imports torch")
    assert any("backend.api → backend.util → backend.helper → torch" in v for v in backend_wall(through))


def test_type_checking_imports_do_not_count_but_their_else_does():
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
    assert backend_wall(ImportGraph.of({"backend.__init__": "", "backend.api": guarded})) == []
    dotted = "import typing\nif typing.TYPE_CHECKING:\n    import torch\nelse:\n    import workers\n"
    assert backend_wall(ImportGraph.of({"backend.__init__": "", "backend.api": dotted, "workers.__init__": ""})) != []


def test_rank_code_reaching_the_database_or_celery_is_caught_even_through_a_package_init():
    base = {
        "workers.__init__": "",
        "workers.harness.__init__": "",
        "workers.harness.loop": "import torch\nfrom workers.harness import data",
    }
    assert rank_wall(ImportGraph.of({**base, "workers.harness.data": "import numpy"})) == []
    db = ImportGraph.of({**base, "workers.harness.data": "from backend.db import session_scope", "backend.__init__": "", "backend.db": ""})
    assert rank_wall(db) != []
    via_init = ImportGraph.of({**base, "workers.__init__": "from celery import Celery", "workers.harness.data": ""})
    assert any("workers imports celery" in v for v in rank_wall(via_init))
    for lib in ("sqlalchemy", "fastapi", "starlette"):
        assert rank_wall(ImportGraph.of({**base, "workers.harness.data": f"import {lib}"})) != [], lib


def test_core_reaching_anything_but_stdlib_and_pydantic_is_caught():
    ok = {
        "parallab.__init__": "",
        "parallab.core.__init__": "",
        "parallab.core.a": "import json, math\nfrom pydantic import BaseModel\nfrom . import b",
        "parallab.core.b": "from typing_extensions import Self\nimport annotated_types, pydantic_core",
    }
    assert core_wall(ImportGraph.of(ok)) == []
    assert core_wall(ImportGraph.of({**ok, "parallab.core.b": "import numpy"})) != []
    assert core_wall(ImportGraph.of({**ok, "parallab.core.b": "def f():\n    import torch\n"})) != []
    outside = {**ok, "parallab.cli": "import typer", "parallab.core.b": "from ..cli import app"}
    assert core_wall(ImportGraph.of(outside)) == [
        "parallab.core.b imports parallab.cli (reached from parallab.core.a → parallab.core.b → parallab.cli)"
    ]
    assert core_wall(ImportGraph.of({**ok, "parallab.__init__": "import requests"})) != []  # an __init__ above the core runs too


def test_figures_reaching_the_database_or_http_are_caught():
    ok = {
        "backend.__init__": "",
        "backend.figures.__init__": "",
        "backend.figures.run": "import plotly.graph_objects as go\nfrom . import common",
        "backend.figures.common": "from parallab.core.flags import agreement",
        "parallab.core.flags": "",
    }
    assert figures_wall(ImportGraph.of(ok)) == []
    for bad in (
        "from backend.store import runs",
        "from backend import models",
        "import backend.db",
        "import httpx",
        "from fastapi import Request",
    ):
        sources = {
            **ok,
            "backend.figures.common": bad,
            "backend.store.__init__": "",
            "backend.store.runs": "",
            "backend.models": "",
            "backend.db": "",
        }
        assert figures_wall(ImportGraph.of(sources)) != [], bad


def test_one_strategy_importing_another_is_caught_but_compose_base_and_the_registry_may():
    ok = {
        "parallab.core.strategies.__init__": "from parallab.core.strategies import ddp, tp, hybrid",
        "parallab.core.strategies.base": "",
        "parallab.core.strategies.layout": "from parallab.core.strategies.base import StrategyDescriptor",
        "parallab.core.strategies.ddp": "from parallab.core.strategies.base import StrategyDescriptor",
        "parallab.core.strategies.tp": "from .base import StrategyDescriptor",
        "parallab.core.strategies.hybrid": "from parallab.core.strategies.layout import LayoutDescriptor",
        "parallab.core.dims.__init__": "from parallab.core.dims import tp, pp",
        "parallab.core.dims.tp": "from parallab.core.dims.base import Dimension",
        "parallab.core.dims.pp": "",
        "parallab.core.dims.base": "",
        "workers.strategies.__init__": "import importlib",
        "workers.strategies.compose": "from workers.strategies import ddp, pipeline",
        "workers.strategies.pipeline": "import torch",
        "workers.strategies.ddp": "import torch",
    }
    assert strategy_wall(ImportGraph.of(ok)) == []
    core = ImportGraph.of({**ok, "parallab.core.strategies.ddp": "from .tp import tp_rules"})
    assert strategy_wall(core) == ["parallab.core.strategies.ddp imports parallab.core.strategies.tp"]
    rank = ImportGraph.of({**ok, "workers.strategies.pipeline": "def f():\n    from workers.strategies import ddp\n"})
    assert strategy_wall(rank) == ["workers.strategies.pipeline imports workers.strategies.ddp"]
    shared = ImportGraph.of({**ok, "parallab.core.strategies.base": "from parallab.core.strategies import tp"})
    assert strategy_wall(shared) == ["parallab.core.strategies.base imports parallab.core.strategies.tp"]
    dims = ImportGraph.of({**ok, "parallab.core.dims.pp": "from parallab.core.dims.tp import x"})
    assert strategy_wall(dims) == ["parallab.core.dims.pp imports parallab.core.dims.tp"]


def test_a_strategy_or_dimension_name_compared_outside_its_modules_is_caught():
    owners = {"pp": frozenset({"parallab.core.strategies.pp", "workers.strategies.pipeline"}), "hybrid": frozenset({"x.hybrid"})}
    ok = {
        "parallab.__init__": "",
        "parallab.core.strategies.pp": "def f(job):\n    return job.strategy == 'pp'\n",
        "workers.strategies.pipeline": "ok = name in ('pp',)",
        "parallab.core.recipes": "if mode == 'full':\n    pass\n",
    }
    assert name_comparisons(ImportGraph.of(ok), owners) == []
    bad = {**ok, "parallab.core.recipes": "refused = name in ('tp', 'hybrid')\nif job.strategy != 'pp':\n    pass\n"}
    assert name_comparisons(ImportGraph.of(bad), owners) == [
        "parallab.core.recipes:1 compares 'hybrid'",
        "parallab.core.recipes:2 compares 'pp'",
    ]


def test_cycles_are_caught_even_through_function_level_imports_but_not_type_checking_ones():
    ok = {"pkg.__init__": "", "pkg.a": "from pkg import b", "pkg.b": "import json"}
    assert cycle_wall(ImportGraph.of(ok)) == []
    assert cycle_wall(ImportGraph.of({**ok, "pkg.b": "def f():\n    import pkg.a\n"})) == ["pkg.a ↔ pkg.b"]
    three = {**ok, "pkg.b": "from pkg.c import x", "pkg.c": "from .a import y"}
    assert cycle_wall(ImportGraph.of(three)) == ["pkg.a ↔ pkg.b ↔ pkg.c"]
    guarded = {**ok, "pkg.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"}
    assert cycle_wall(ImportGraph.of(guarded)) == []
    registry = {"pkg.__init__": "from pkg import a", "pkg.a": "from pkg.b import x", "pkg.b": ""}
    assert cycle_wall(ImportGraph.of(registry)) == []  # a package importing its modules is no cycle


def test_an_engine_opening_a_database_session_is_caught_directly_and_through_a_helper():
    ok = {
        "workers.__init__": "",
        "workers.engines.__init__": "",
        "workers.engines.base": "from parallab.core.jobs import ResolvedJob",
        "workers.engines.host": "from workers.engines.base import Engine\nfrom backend.config import Settings",
        "backend.__init__": "",
        "backend.config": "import pydantic",
        "backend.db": "import sqlalchemy",
        "workers.helper": "from backend.db import session_scope",
    }
    assert engine_wall(ImportGraph.of(ok)) == []
    direct = ImportGraph.of({**ok, "workers.engines.host": "from backend.db import session_scope"})
    assert engine_wall(direct) == ["workers.engines.host imports backend.db (reached from workers.engines.host → backend.db)"]
    through = ImportGraph.of({**ok, "workers.engines.host": "def reconcile():\n    from workers import helper\n"})
    assert any("workers.helper imports backend.db" in v for v in engine_wall(through))
    assert engine_wall(ImportGraph.of({**ok, "workers.engines.base": "from sqlalchemy.orm import Session"})) != []


def test_the_coordinator_reaching_a_backend_module_is_caught_even_the_ledgers_implementation():
    ok = {
        "workers.__init__": "",
        "workers.coordinator": "from parallab.core.ledger import Ledger\nfrom workers import aggregate",
        "workers.aggregate": "from parallab.core.result import ResultDocument",
        "backend.__init__": "",
        "backend.services.__init__": "",
        "backend.services.ledger": "from backend.db import session_scope",
    }
    assert coordinator_wall(ImportGraph.of(ok)) == []
    wired = ImportGraph.of({**ok, "workers.coordinator": "from backend.services.ledger import DbLedger"})
    assert coordinator_wall(wired) != []
    through = ImportGraph.of({**ok, "workers.aggregate": "from backend.config import Settings", "backend.config": ""})
    assert any("workers.aggregate imports backend" in v for v in coordinator_wall(through))
    assert coordinator_wall(ImportGraph.of({**ok, "workers.aggregate": "import celery"})) != []


def test_an_engine_named_outside_its_module_and_the_registry_is_caught():
    engines = {
        "SlurmEngine": frozenset({"workers.engines.slurm", "workers.agent"}),
        "HostTorchrun": frozenset({"workers.engines.host"}),
    }
    ok = {
        "workers.engines.slurm": "class SlurmEngine:\n    pass\n",
        "workers.engines.host": "class HostTorchrun:\n    pass\n",
        "workers.engines.registry": "from workers.engines.slurm import SlurmEngine\nimport workers.engines.host as h\nH = h.HostTorchrun",
        "workers.agent": "from workers.engines.slurm import SlurmEngine",
        "workers.coordinator": "from workers.engines.base import Engine",
    }
    assert engine_names(ImportGraph.of(ok), engines, registry="workers.engines.registry") == []
    imported = ImportGraph.of({**ok, "workers.coordinator": "from workers.engines.slurm import SlurmEngine"})
    assert engine_names(imported, engines, registry="workers.engines.registry") == ["workers.coordinator names engine SlurmEngine"]
    attribute = ImportGraph.of({**ok, "backend.pools": "from workers.engines import host\ne = host.HostTorchrun(1)"})
    assert engine_names(attribute, engines, registry="workers.engines.registry") == ["backend.pools names engine HostTorchrun"]
