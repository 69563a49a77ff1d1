"""The promise map: every promise the docs make has a test on every path it applies to.

A promise is a sentence of ``README.md`` or ``docs/`` that tells a user or operator
what they can rely on: an input refused, a run stopped, a write aborted or skipped,
something that never happens to their rows. Each one carries an id right after it, on
the same line (an HTML comment: readers see nothing)::

    ... is refused. <!-- promise: batch-into-stream-refused paths=datasource,grouped -->

and each test that proves it on a path carries the marker
``@pytest.mark.promise("batch-into-stream-refused", "grouped")`` (one id, one or more paths;
on a function, a class, a module's ``pytestmark`` or a ``pytest.param``). A sentence
that restates a promise made elsewhere carries ``<!-- promise-ref: ID -->``; a
sentence that uses a promise word without making a promise (how a mechanism works,
an instruction to the reader, a test's description) carries ``<!-- not-a-promise:
why -->``. The words are those of :data:`WORDS`, outside code spans; an annotation
covers the text of its block (paragraph, list item, table row) since the previous
annotation, so every such word must have one after it in its block. How to write
them: ``docs/writing-a-backend.md`` (*Promises your page makes*).

The paths (:data:`PATHS`): the four data paths and two that are not one:

* ``datasource``: ``format("txsink")``, streams and batch writes, single sink and group;
* ``grouped``: ``txsink.spark.epoch(...)`` grouped writes, in ``foreachBatch`` or a job;
* ``native``: Spark's own Parquet writer (files, Delta, Iceberg targets), through
  :mod:`txsink.gate`;
* ``realtime``: Real-time Mode (``start_realtime``, ``trigger: {real_time: ...}``);
* ``cli``: a ``txsink`` command (or the Python function behind it), which reads and
  changes the state and targets whatever path wrote them;
* ``backend``: code below the data paths that every one of them reaches through the
  same call: a backend's own (its option parsing, commit, abort, recovery answers), a
  state store's, and the engine's bookkeeping (plugin loading, the committable format,
  the secret check); proven against the real server through that code's API.

How a promise's paths are chosen: a data path is named when what the promise says
happens in that path's adapter or in the order the adapter calls the gate (when a
refusal comes, which replay is skipped, what a restart recovers), so a path could keep
it and another not; ``backend`` when it happens wholly inside code all paths share; a
promise made only for some paths (streams, batch writes, groups) names only those.

A test proves a promise only where it runs: the default run (``uv run pytest``), or a
tox environment whose variables lift its skip (``tests/long_runs.py``) and whose
commands collect its file (read from ``tox.ini``). ``python -m
tests.unit.test_promise_map`` prints the whole map.
"""

from __future__ import annotations

import ast
import configparser
import re
import shlex
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The data paths, then the two scopes that are not a data path.
DATA_PATHS = ("datasource", "grouped", "native", "realtime")
PATHS = (*DATA_PATHS, "cli", "backend")
#: Pages not written by hand: ``benchmarks/report.py`` renders performance.md from
#: measurements (it makes no promise, and would drop an annotation at the next run).
GENERATED = ("docs/performance.md",)
#: Words that mark a sentence as a possible promise (outside code spans and links).
WORDS = re.compile(
    r"\brefus\w*|\breject\w*|\bstop(?:s|ped)?\b|\babort\w*|\bskip\w*|\bnever\b"
    r"|\brolled back\b|\bnothing\b[^.]{0,20}\bwritten\b|\bwrites? nothing\b"
    r"|\bfail(?:s|ed)?\b|\bloud\w*|\brais\w*", re.I)
ID = r"[a-z0-9]+(?:-[a-z0-9]+)*"
ANNOTATION = re.compile(
    r"<!-- (?:(?P<kind>promise): (?P<id>\S+) paths=(?P<paths>\S+)"
    r"|(?P<refkind>promise-ref): (?P<ref>\S+)"
    r"|(?P<notkind>not-a-promise): (?P<why>\S.*?)) -->")
#: Anything that looks like an annotation, to catch a malformed one.
LOOSE = re.compile(r"<!--\s*(?:promise|not-a-promise)\b.*?-->")
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"\]\([^)]*\)")
_ITEM = re.compile(r"(\s*)(?:[*+-]|\d+\.)\s+")


@dataclass
class Promise:
    id: str
    paths: tuple[str, ...]
    doc: str
    line: int
    text: str


@dataclass
class Page:
    """What one page says: its promises, references, notes and its problems."""

    doc: str
    promises: list[Promise] = field(default_factory=list)
    refs: list[tuple[str, int]] = field(default_factory=list)
    notes: int = 0
    problems: list[str] = field(default_factory=list)


def docs() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.relative_to(ROOT).as_posix() not in GENERATED]


def blocks(text: str) -> Iterator[list[tuple[int, str]]]:
    """Paragraphs, list items and table rows, as (line number, line) lists; fenced and
    indented code, headings and table header rows left out."""
    cur: list[tuple[int, str]] = []
    fence = code = False
    blank = True
    list_indent = 0
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        bare = line.strip()
        if bare.startswith(("```", "~~~")):
            fence = not fence
            if cur:
                yield cur
            cur = []
            continue
        if fence:
            continue
        if not bare:
            if cur:
                yield cur
            cur, blank = [], True
            continue
        indent = len(line) - len(line.lstrip())
        if (blank or code) and indent >= list_indent + 4:
            code, blank = True, False
            continue
        code = False
        if re.fullmatch(r"<!--.*-->", bare) and not LOOSE.search(bare):
            blank = False
            continue
        item = _ITEM.match(line)
        if bare.startswith(("|", "#")):
            if cur:
                yield cur
            cur, blank = [], False
            if indent == 0:
                list_indent = 0
            # a heading names a section and a header row names columns: neither is a
            # sentence, the rows and paragraphs under them make the promises
            header = number < len(lines) and re.fullmatch(r"\|?[\s:|-]+\|?",
                                                          lines[number].strip() or "x")
            if bare.startswith("|") and not header:
                yield [(number, line)]
            continue
        if item:
            if cur:
                yield cur
            cur, list_indent = [], len(item.group(0))
        elif blank:
            if cur:
                yield cur
            cur = []
            if indent == 0:
                list_indent = 0
        cur.append((number, line))
        blank = False
    if cur:
        yield cur


def _words(text: str) -> list[str]:
    return [m.group(0) for m in WORDS.finditer(_LINK.sub("]", _CODE.sub("", text)))]


def read_page(path: Path) -> Page:
    doc = path.relative_to(ROOT).as_posix()
    page = Page(doc)
    for block in blocks(path.read_text(encoding="utf-8")):
        rest: list[tuple[int, str]] = []  # the text since the last annotation
        for number, line in block:
            if LOOSE.match(line.strip()) and not line.lstrip().startswith("|"):
                page.problems.append(
                    f"{doc}:{number}: an annotation starts the line: Markdown then ends the "
                    f"paragraph there; put it after the sentence, on the sentence's line")
            bare = _CODE.sub("", line)  # an annotation shown as code is an example
            pos = 0
            for m in LOOSE.finditer(bare):
                rest.append((number, bare[pos:m.start()]))
                pos = m.end()
                good = ANNOTATION.fullmatch(m.group(0))
                said = " ".join(t for _, t in rest).strip()
                rest = []
                if good is None:
                    page.problems.append(f"{doc}:{number}: malformed annotation "
                                         f"{m.group(0)!r}")
                elif good.group("kind"):
                    paths = tuple(good.group("paths").split(","))
                    page.promises.append(Promise(good.group("id"), paths, doc, number, said))
                elif good.group("refkind"):
                    page.refs.append((good.group("ref"), number))
                else:
                    page.notes += 1
            rest.append((number, bare[pos:]))
        left = [(n, w) for n, t in rest for w in _words(t)]
        if left:
            page.problems.append(
                f"{doc}:{left[0][0]}: {', '.join(repr(w) for _, w in left)} without a "
                f"promise id or a not-a-promise note after it in its paragraph/row")
    return page


def strip_annotations(text: str) -> str:
    """The page without its annotations (those shown as code stay)."""
    out = []
    fence = False
    for line in text.split("\n"):
        if line.strip().startswith(("```", "~~~")):
            fence = not fence
        if not fence:
            pieces = re.split(r"(`+(?:(?!`).)+?`+)", line)
            line = "".join(p if p.startswith("`") else re.sub(r" ?" + LOOSE.pattern, "", p)
                           for p in pieces)
        out.append(line)
    return "\n".join(out)


def read_docs() -> list[Page]:
    return [read_page(p) for p in docs()]


# -- tests ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One way the suite runs: the default run, or a tox environment."""

    name: str
    variables: frozenset[str]
    paths: tuple[str, ...]
    marker: str | None = None


@dataclass
class Binding:
    """A promise marker on one collected test."""

    id: str
    paths: tuple[str, ...]
    nodeid: str
    line: int
    runs: tuple[str, ...]
    xfail: bool = False


def _factor_sections(name: str) -> list[tuple[str, str | None]]:
    """``integration-{files,kafka}`` -> [(integration-files, files), ...]."""
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [(name, None)]
    return [(name[:m.start()] + f + name[m.end():], f) for f in m.group(1).split(",")]


def _factored(lines: str, factor: str | None) -> list[str]:
    out = []
    for raw in lines.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([\w,-]+):\s+(.*)", line)
        if m and not m.group(1).startswith("TXSINK"):
            if factor is None or factor not in m.group(1).split(","):
                continue
            line = m.group(2)
        out.append(line)
    return out


#: pytest options that take the next word as their value.
_VALUED = frozenset({"-m", "-k", "-n", "-p", "-c", "-o", "-W", "--numprocesses", "--dist",
                     "--rootdir", "--deselect", "--ignore", "--durations"})


def runs() -> list[Run]:
    """The default run and every tox environment that runs pytest."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    found = [Run("default", frozenset(), ("tests",))]
    for section in ini.sections():
        if not section.startswith("testenv:"):
            continue
        for env, factor in _factor_sections(section.removeprefix("testenv:")):
            variables = {m.group(1) for line in _factored(ini[section].get("set_env", ""),
                                                          factor)
                         if (m := re.match(r"(TXSINK_\w+)\s*=\s*1$", line))}
            commands = " ".join(_factored(ini[section].get("commands", ""), factor))
            for command in re.split(r"(?<!\\)\s(?=pytest\b|python\b)",
                                    commands.replace("\\\n", " ")):
                words = shlex.split(re.sub(r"\{posargs:([^}]*)\}", r"\1",
                                           command.replace("{posargs}", "").replace("\\",
                                                                                    "")))
                if not words or words[0] != "pytest":
                    continue
                marker = words[words.index("-m") + 1] if "-m" in words else None
                given = [w for i, w in enumerate(words[1:], 1)
                         if not w.startswith("-") and words[i - 1] not in _VALUED]
                # No path given: pytest's testpaths. Paths that do not exist: nothing.
                paths = tuple(w for w in given if (ROOT / w.split("::")[0]).exists())
                found.append(Run(env, frozenset(variables),
                                 paths if given else ("tests",), marker))
    return found


def _constants(tree: ast.Module, known: dict[str, str]) -> dict[str, str]:
    """Module-level string constants and names imported from tests.long_runs."""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            out[node.targets[0].id] = node.value.value
        if isinstance(node, ast.ImportFrom) and node.module == "tests.long_runs":
            for alias in node.names:
                if alias.name in known:
                    out[alias.asname or alias.name] = known[alias.name]
    return out


def _gate(call: ast.expr, consts: dict[str, str]) -> str | None:
    """The variable of ``skipif(os.environ.get(VAR) != "1", ...)``, else None."""
    if not (isinstance(call, ast.Call) and call.args):
        return None
    cond = call.args[0]
    if (isinstance(cond, ast.Compare) and isinstance(cond.left, ast.Call)
            and ast.unparse(cond.left.func) == "os.environ.get" and cond.left.args):
        arg = cond.left.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return consts.get(arg.id)
    return None


def _conftest_gates() -> dict[str, str]:
    """Directories whose ``conftest.py`` skips every test below it unless a variable is
    set (its ``pytest_collection_modifyitems`` adds a ``skip`` marker; the variable is
    its module's ``TXSINK_*`` constant): directory -> variable."""
    out = {}
    for path in sorted((ROOT / "tests").rglob("conftest.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        variables = [v for v in _constants(tree, {}).values() if v.startswith("TXSINK_")]
        hook = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
                     and n.name == "pytest_collection_modifyitems"), None)
        if hook is not None and len(variables) == 1 and "pytest.mark.skip" in ast.unparse(hook):
            out[path.parent.relative_to(ROOT).as_posix()] = variables[0]
    return out


def _long_run_gates() -> dict[str, str]:
    """``long_run`` -> ``TXSINK_LONG`` and its siblings, from tests/long_runs.py."""
    tree = ast.parse((ROOT / "tests" / "long_runs.py").read_text())
    consts = _constants(tree, {})
    gates = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            var = _gate(node.value, consts)
            if var is not None:
                gates[node.targets[0].id] = var
    return {**gates, **{k: v for k, v in consts.items() if v.startswith("TXSINK_")}}


@dataclass
class _Marks:
    promises: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    gates: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    skipped: bool = False
    xfail: bool = False

    def __add__(self, other: _Marks) -> _Marks:
        return _Marks(self.promises + other.promises, self.gates | other.gates,
                      self.names | other.names, self.skipped or other.skipped,
                      self.xfail or other.xfail)


def _marks(exprs: list[ast.expr], consts: dict[str, str], gates: dict[str, str],
           problems: list[str], where: str) -> _Marks:
    out = _Marks()
    for expr in exprs:
        if isinstance(expr, (ast.List, ast.Tuple)):
            out = out + _marks(list(expr.elts), consts, gates, problems, where)
            continue
        if isinstance(expr, ast.Name) and expr.id in gates:
            out.gates.add(gates[expr.id])
            continue
        func = expr.func if isinstance(expr, ast.Call) else expr
        name = ast.unparse(func)
        if not name.startswith("pytest.mark."):
            continue
        mark = name.removeprefix("pytest.mark.")
        out.names.add(mark)
        if mark == "skip":
            out.skipped = True
        elif mark == "xfail":
            out.xfail = True
        elif mark == "skipif" and (var := _gate(expr, consts)) is not None:
            out.gates.add(var)
        elif mark == "promise":
            args = expr.args if isinstance(expr, ast.Call) else []
            values = [a.value for a in args
                      if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(values) != len(args) or len(values) < 2:
                problems.append(f"{where}:{expr.lineno}: pytest.mark.promise takes string "
                                f"constants, an id and one or more paths")
                continue
            out.promises.append((values[0], tuple(values[1:]), expr.lineno))
    return out


def _params(decorators: list[ast.expr]) -> list[tuple[str, list[ast.expr]]]:
    """Each ``pytest.param(..., marks=..., id=...)`` of a parametrize decorator."""
    out = []
    for dec in decorators:
        if not (isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("parametrize")):
            continue
        for node in ast.walk(dec):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.param":
                kw = {k.arg: k.value for k in node.keywords}
                if "marks" in kw:
                    ident = kw.get("id")
                    first = node.args[0] if node.args else None
                    label = (ident.value if isinstance(ident, ast.Constant)
                             else first.value if isinstance(first, ast.Constant)
                             else ast.unparse(first) if first is not None else "?")
                    out.append((str(label), [kw["marks"]]))
    return out


def _where_it_runs(nodeid: str, marks: _Marks, all_runs: list[Run]) -> tuple[str, ...]:
    """``("default",)`` when the default run has the test, else the tox environments
    that do (empty: none does)."""
    if marks.skipped:
        return ()
    doc = nodeid.split("::")[0]
    out = []
    for run in all_runs:
        if not marks.gates <= run.variables:
            continue
        if run.marker is not None and run.marker not in marks.names:
            continue
        for p in run.paths:
            if "::" in p:
                hit = nodeid.startswith(p) or p.startswith(nodeid)
            else:
                hit = doc == p or doc.startswith(p.rstrip("/") + "/")
            if hit:
                if run.name == "default":
                    return ("default",)
                if run.name not in out:
                    out.append(run.name)
    return tuple(out)


def _read_file(path: Path, gates: dict[str, str], all_runs: list[Run],
               problems: list[str], nowhere: list[str] | None = None,
               dir_gates: dict[str, str] | None = None) -> list[Binding]:
    """The promise markers of one test file's tests; ``nowhere`` gets the tests no run
    collects (neither the default run nor a tox environment) that no ``skip`` marks."""
    doc = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    consts = _constants(tree, gates)
    dir_gates = dir_gates or {}
    out: list[Binding] = []
    module = _Marks()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "pytestmark"):
            module = _marks([node.value], consts, gates, problems, doc)
    module.gates |= {var for where, var in dir_gates.items()
                     if doc.startswith(where + "/")}

    def emit(found: _Marks, nodeid: str, marks: _Marks) -> None:
        for ident, paths, _line in found.promises:
            out.append(Binding(ident, paths, nodeid, _line,
                               _where_it_runs(nodeid, marks, all_runs), marks.xfail))

    def visit(fn: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str, above: _Marks) -> None:
        nodeid = f"{doc}::{prefix}{fn.name}"
        own = _marks(list(fn.decorator_list), consts, gates, problems, doc)
        whole = above + own
        cases = [(label, _marks(exprs, consts, gates, problems, doc))
                 for label, exprs in _params(list(fn.decorator_list))]
        # A case named after a path (``pytest.param("grouped", marks=...)``) is that
        # path's test of the function's promises: its marks (an xfail) count there.
        by_path = {label: case for label, case in cases if label in PATHS}
        for ident, paths, line in own.promises:
            for path in paths:
                marks = whole + by_path[path] if path in by_path else whole
                out.append(Binding(ident, (path,), nodeid, line,
                                   _where_it_runs(nodeid, marks, all_runs), marks.xfail))
        if nowhere is not None and not whole.skipped and not _where_it_runs(
                nodeid, whole, all_runs):
            nowhere.append(nodeid)
        for label, case in cases:
            emit(case, f"{nodeid}[{label}]", whole + case)

    emit(module, doc, module)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            visit(node, "", module)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            # a class marker covers its tests, inherited ones too (a conformance kit)
            cls = _marks(list(node.decorator_list), consts, gates, problems, doc)
            emit(cls, f"{doc}::{node.name}", module + cls)
            for method in node.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        method.name.startswith("test"):
                    visit(method, f"{node.name}::", module + cls)
    return out


def read_tests(problems: list[str], nowhere: list[str] | None = None) -> list[Binding]:
    gates = _long_run_gates()
    dir_gates = _conftest_gates()
    all_runs = runs()
    out: list[Binding] = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        out += _read_file(path, gates, all_runs, problems, nowhere, dir_gates)
    return out


# -- the map --------------------------------------------------------------------------------

@dataclass
class PromiseMap:
    pages: list[Page]
    bindings: list[Binding]
    problems: list[str]

    @property
    def promises(self) -> dict[str, Promise]:
        return {p.id: p for page in self.pages for p in page.promises}

    def cells(self) -> dict[tuple[str, str], list[Binding]]:
        cells: dict[tuple[str, str], list[Binding]] = {
            (p.id, path): [] for page in self.pages for p in page.promises for path in p.paths}
        for b in self.bindings:
            for path in b.paths:
                if (b.id, path) in cells and b.runs:
                    cells[(b.id, path)].append(b)
        return cells

    def table(self, only_missing: bool = False) -> str:
        promises = self.promises
        rows = []
        for (ident, path), tests in sorted(self.cells().items()):
            if only_missing and tests:
                continue
            p = promises[ident]
            where = "; ".join(f"{t.nodeid} ({', '.join(t.runs)}{', xfail' if t.xfail else ''})"
                              for t in tests) or "MISSING"
            rows.append(f"{ident:<44} {path:<10} {p.doc}:{p.line}  {where}")
        return "\n".join(rows)

    def counts(self) -> str:
        per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for page in self.pages:
            for p in page.promises:
                per[page.doc]["promises"] += 1
                for path in p.paths:
                    per[page.doc][path] += 1
        cols = ("promises", *PATHS)
        lines = [f"{'page':<32}" + "".join(f"{c:>11}" for c in cols)]
        for doc in sorted(per):
            lines.append(f"{doc:<32}" + "".join(f"{per[doc][c]:>11}" for c in cols))
        lines.append(f"{'total':<32}" + "".join(
            f"{sum(per[d][c] for d in per):>11}" for c in cols))
        return "\n".join(lines)


def promise_map() -> PromiseMap:
    problems: list[str] = []
    pages = read_docs()
    bindings = read_tests(problems)
    return PromiseMap(pages, bindings, problems)


@pytest.fixture(scope="module")
def the_map() -> PromiseMap:
    return promise_map()


def test_every_sentence_with_a_promise_word_is_marked(the_map: PromiseMap) -> None:
    problems = [p for page in the_map.pages for p in page.problems]
    assert problems == [], (
        "sentences of the docs that use a promise word need <!-- promise: ID paths=... --> "
        "or <!-- not-a-promise: why --> after them (see docs/writing-a-backend.md):\n"
        + "\n".join(problems))


def test_promise_ids_are_unique_and_well_formed(the_map: PromiseMap) -> None:
    seen: dict[str, str] = {}
    bad = []
    for page in the_map.pages:
        for p in page.promises:
            where = f"{p.doc}:{p.line}"
            if not re.fullmatch(ID, p.id):
                bad.append(f"{where}: id {p.id!r} is not lower-case words joined by '-'")
            if p.id in seen:
                bad.append(f"{where}: id {p.id!r} is already used at {seen[p.id]}")
            seen.setdefault(p.id, where)
            if not p.paths or len(set(p.paths)) != len(p.paths) or \
                    not set(p.paths) <= set(PATHS):
                bad.append(f"{where}: paths={','.join(p.paths)}: give each once, from "
                           f"{', '.join(PATHS)}")
        for ref, line in page.refs:
            if ref not in the_map.promises:
                bad.append(f"{page.doc}:{line}: promise-ref {ref!r} names no promise")
    assert bad == [], "\n".join(bad)


def test_every_marker_names_a_promise_and_one_of_its_paths(the_map: PromiseMap) -> None:
    promises = the_map.promises
    bad = list(the_map.problems)
    for b in the_map.bindings:
        if b.id not in promises:
            bad.append(f"{b.nodeid}: pytest.mark.promise({b.id!r}): no page carries that id")
        elif extra := set(b.paths) - set(promises[b.id].paths):
            bad.append(f"{b.nodeid}: pytest.mark.promise({b.id!r}, ...): the promise "
                       f"({promises[b.id].doc}:{promises[b.id].line}) does not name "
                       f"{', '.join(sorted(extra))}")
        if not b.runs:
            bad.append(f"{b.nodeid}: carries promise {b.id!r} but runs neither in the "
                       f"default run nor in a tox environment")
    assert bad == [], "\n".join(bad)


def test_every_promise_has_a_test_on_every_path_it_applies_to(the_map: PromiseMap) -> None:
    """A pair whose only tests are strict xfails is a promise known false on that path:
    it has its test (which fails once the fix lands, and the mark goes); the map lists
    it (``python -m tests.unit.test_promise_map --false``)."""
    missing = [cell for cell, tests in the_map.cells().items() if not tests]
    assert missing == [], (
        f"{len(missing)} (promise, path) pairs without a test that runs (default run or a "
        f"tox environment):\n" + the_map.table(only_missing=True))


def test_annotations_change_nothing_a_reader_sees() -> None:
    """Rendered with the site's Markdown extensions, every page is the same HTML with its
    annotations as without them (an annotation at the start of a line would end the
    paragraph; inside a table row it would add a cell)."""
    markdown = pytest.importorskip("markdown", reason="Python-Markdown comes with mkdocs "
                                                      "(the dev group)")
    extensions = ["toc", "tables", "fenced_code", "admonition"]
    comment = re.compile(r"\s*<!--.*?-->", re.S)
    changed = []
    for path in docs():
        text = path.read_text(encoding="utf-8")
        plain = strip_annotations(text)
        if plain == text:
            continue
        a = comment.sub("", markdown.markdown(text, extensions=extensions))
        b = comment.sub("", markdown.markdown(plain, extensions=extensions))
        if re.sub(r"\s+", " ", a) != re.sub(r"\s+", " ", b):
            changed.append(path.relative_to(ROOT).as_posix())
    assert changed == [], f"annotations change the rendered page: {changed}"


def test_every_test_kept_out_of_the_default_run_runs_in_a_tox_environment() -> None:
    """A test a long-run variable keeps out of the default run must be collected by a tox
    environment that sets the variable (two native-path crash tests in
    tests/integration ran nowhere: ``e2e-long`` collected tests/e2e only)."""
    nowhere: list[str] = []
    read_tests([], nowhere)
    assert nowhere == [], "tests that run neither in the default run nor in any tox environment"


def test_the_map_reads_the_runs_of_tox_ini() -> None:
    """The tox environments the map relies on are read as tox.ini defines them."""
    found = runs()

    def run(name: str, path: str) -> Run:
        return next(r for r in found if r.name == name and path in r.paths)

    assert found[0] == Run("default", frozenset(), ("tests",))
    assert run("e2e-long", "tests/e2e").variables == {"TXSINK_LONG"}
    assert run("e2e-long", "tests/e2e").marker == "spark"
    assert "TXSINK_CHAOS" in run("chaos", "tests/chaos").variables
    assert "TXSINK_CLUSTER_LONG" in run("cluster", "tests/cluster").variables
    assert "TXSINK_EXAMPLE_TESTS" in run("examples",
                                         "tests/e2e/test_examples_readme.py").variables
    assert "TXSINK_LAKE_S3" in run("integration-delta", "tests/integration/delta").variables
    assert run("integration-postgres", "tests/integration/postgres").marker is None


if __name__ == "__main__":
    found = promise_map()
    if "--missing" in sys.argv:
        print(found.table(only_missing=True))
    elif "--false" in sys.argv:
        print("\n".join(f"{i} {p}: " + "; ".join(t.nodeid for t in ts)
                        for (i, p), ts in sorted(found.cells().items())
                        if ts and all(t.xfail for t in ts)))
    elif "--unmarked" in sys.argv:
        print("\n".join(p for page in found.pages for p in page.problems))
    else:
        print(found.table())
        print()
        print(found.counts())
