"""The floors of ``core/src/txsink`` stay floors: no import circle, the engine never
reaches up into the Spark adapter, and core never imports a backend package (backends
give core what it needs through the plugin hooks, as a third party's would).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a circle
hidden from the interpreter is still one for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "core" / "src"
#: Only these may import ``txsink.spark``: the adapter itself, the CLI that runs it,
#: and the testing helpers that start Spark.
SPARK_USERS = ("txsink.spark", "txsink.cli", "txsink.testing")
BACKENDS = Path(__file__).resolve().parents[2] / "backends"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_core_has_no_import_circle() -> None:
    graph = import_graph()
    assert graph.get("txsink.coordinator")  # it read the tree
    found = circles(graph)
    assert not found, "import circles in core/src/txsink: " + "; ".join(
        " -> ".join(c) for c in found)


def test_the_engine_never_imports_the_spark_adapter() -> None:
    offenders = sorted(f"{m} -> {t}" for m, targets in import_graph().items()
                       if not m.startswith(SPARK_USERS)
                       for t in targets if t.startswith("txsink.spark"))
    assert not offenders, f"engine modules importing txsink.spark: {offenders}"


def test_the_circle_finder_finds_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def top_level_imports(source: str) -> set[str]:
    """The top-level package of every absolute import in ``source`` (also inside a
    function or under ``TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def backend_packages() -> set[str]:
    """Our backends' import packages, and any ``txsink_*`` name (a third party's)."""
    return {p.name for p in BACKENDS.glob("*/src/*") if p.is_dir() and p.name.isidentifier()}


def _is_backend(package: str, known: set[str]) -> bool:
    return package in known or package.startswith("txsink_")


def test_core_never_imports_a_backend_package() -> None:
    known = backend_packages()
    assert "txsink_kafka" in known  # it read the backends
    offenders = sorted(f"{name} -> {package}" for name, path in _modules().items()
                       for package in top_level_imports(path.read_text())
                       if _is_backend(package, known))
    assert not offenders, f"core modules importing a backend package: {offenders}"


def test_the_backend_import_finder_finds_them() -> None:
    code = ("def f():\n    from txsink_kafka.source import register_source\n"
            "import txsink_s3.objects as o\nfrom txsink.errors import ConfigError\n"
            "from . import sibling\n")
    assert top_level_imports(code) == {"txsink_kafka", "txsink_s3", "txsink"}
    assert [p for p in sorted(top_level_imports(code)) if _is_backend(p, set())] == [
        "txsink_kafka", "txsink_s3"]
