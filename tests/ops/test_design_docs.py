"""The design pages agree with the code.

- The commit triggers table (docs/architecture/write-path.md, "## Commit triggers")
  names exactly the reasons the daemon starts flushes for, each with exactly the files
  that use it, and no other page keeps a second list of them.
- Every repository path the design pages name exists, and the layout table of
  docs/design.md names every package and top-level module of daemon/.

The reasons are read from the code with ``ast``: the reason argument of every call of
a write-path method that takes one (`REASON_METHODS`: ``writer.flush("manual")``,
``self._background_flush("age")``, ``writer.commit_soon("caught_up")``, ...), and the
string default of a ``reason`` parameter of those methods (``TableWriter.close``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest


def _repo_root() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "mkdocs.yml").is_file() and (folder / "daemon").is_dir():
            return folder
    raise AssertionError("no repository root (mkdocs.yml beside daemon/) above this test")


REPO = _repo_root()
DOCS = REPO / "docs"
DESIGN = DOCS / "design.md"
ARCHITECTURE = DOCS / "architecture"
TRIGGERS_PAGE = ARCHITECTURE / "write-path.md"
TRIGGERS_HEADING = "## Commit triggers"

#: The write path's methods whose first argument (or ``reason=``) is a flush's reason.
REASON_METHODS = frozenset(
    {"flush", "close", "commit_soon", "_background_flush", "_schedule", "_schedule_nowait"}
)
#: The name a reason passes through under (a method handing its caller's reason on).
_PASSED_ON = "reason"
_ROW = re.compile(r"^\|\s*`(?P<reason>[^`]+)`\s*\|(?P<rest>.*)\|\s*$")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_REPO_PATH = re.compile(r"^(?:daemon|spool|tests|docs|deploy|helm|requirements)/[\w./-]*$")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


# ------------------------------------------------------------------ the code's reasons


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a string (``_FLUSH_REASON: Final = "..."``)."""
    found: dict[str, str] = {}
    for node in tree.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = value.value
    return found


def _reason_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "reason":
            return keyword.value
    return call.args[0] if call.args else None


def _reason_defaults(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.expr]:
    """The default of ``function``'s ``reason`` parameter, if it has one."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    with_default = positional[len(positional) - len(arguments.defaults) :]
    for arg, default in [
        *zip(with_default, arguments.defaults, strict=True),
        *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
    ]:
        if arg.arg == _PASSED_ON and default is not None:
            yield default


def _reasons_in(path: Path) -> Iterator[tuple[str, int]]:
    """(reason, line) of every flush reason ``path`` uses; fails on one it cannot read."""
    tree = ast.parse(path.read_text(), filename=str(path))
    strings = _module_strings(tree)
    where = path.relative_to(REPO)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in REASON_METHODS:
                for default in _reason_defaults(node):
                    if isinstance(default, ast.Constant) and isinstance(default.value, str):
                        yield default.value, default.lineno
            continue
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in REASON_METHODS
        ):
            continue
        argument = _reason_argument(node)
        if argument is None:  # sys.stdout.flush(), a default reason
            continue
        if isinstance(argument, ast.Constant):
            if isinstance(argument.value, str):
                yield argument.value, node.lineno
            continue  # not a reason (some other object's close(0))
        if isinstance(argument, ast.Name) and argument.id == _PASSED_ON:
            continue  # handed on from the caller, who names it
        if isinstance(argument, ast.Name) and argument.id in strings:
            yield strings[argument.id], node.lineno
            continue
        raise AssertionError(
            f"{where}:{node.lineno}: .{node.func.attr}({ast.unparse(argument)}) passes a "
            "flush reason this test cannot read; pass a string literal, a module-level "
            f"string constant, or the caller's `{_PASSED_ON}`"
        )


def code_reasons() -> dict[str, dict[str, list[int]]]:
    """reason -> {file -> lines} for every flush reason used under daemon/."""
    found: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted((REPO / "daemon").rglob("*.py")):
        for reason, line in _reasons_in(path):
            found[reason][path.relative_to(REPO).as_posix()].append(line)
    return found


# ------------------------------------------------------------------ the docs' triggers


def _section(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise AssertionError(f"{TRIGGERS_PAGE.relative_to(REPO)} has no {heading!r}") from None
    section: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        section.append(line)
    return section


def documented_triggers() -> dict[str, set[str]]:
    """reason -> the code files its row names, from the commit triggers table."""
    rows: dict[str, set[str]] = {}
    for line in _section(TRIGGERS_PAGE.read_text(), TRIGGERS_HEADING):
        row = _ROW.match(line)
        if row is None:
            continue
        reason = row["reason"]
        assert reason not in rows, f"commit trigger `{reason}` has two rows"
        where = row["rest"].rsplit("|", 1)[-1]
        rows[reason] = {span for span in _CODE_SPAN.findall(where) if _REPO_PATH.match(span)}
    assert rows, f"no rows of `reason` under {TRIGGERS_HEADING!r} in {TRIGGERS_PAGE}"
    return rows


def _design_pages() -> list[Path]:
    return [DESIGN, *sorted(ARCHITECTURE.glob("*.md"))]


def _prose(page: Path) -> str:
    """The page without its fenced blocks (diagrams, file trees)."""
    return _FENCE.sub("", page.read_text())


# ------------------------------------------------------------------ tests


def test_every_flush_reason_of_the_code_is_a_documented_trigger() -> None:
    used = code_reasons()
    assert used, "no flush reason found under daemon/: is REASON_METHODS still right?"
    documented = documented_triggers()
    missing = {
        reason: sorted(files) for reason, files in sorted(used.items()) if reason not in documented
    }
    assert not missing, "\n".join(
        f"commit trigger `{reason}` is used in {', '.join(files)} but has no row under "
        f"{TRIGGERS_HEADING!r} in {TRIGGERS_PAGE.relative_to(REPO)}"
        for reason, files in missing.items()
    )


def test_every_documented_trigger_is_a_flush_reason_of_the_code() -> None:
    used = code_reasons()
    stale = sorted(set(documented_triggers()) - set(used))
    assert not stale, "\n".join(
        f"commit trigger `{reason}` has a row in {TRIGGERS_PAGE.relative_to(REPO)} but "
        "no code under daemon/ passes it as a flush reason"
        for reason in stale
    )


def test_each_trigger_row_names_the_files_that_use_it() -> None:
    used = code_reasons()
    wrong = [
        f"commit trigger `{reason}`: its row names {sorted(named) or 'no file'}, the code "
        f"uses it in {sorted(used[reason])}"
        for reason, named in sorted(documented_triggers().items())
        if reason in used and named != set(used[reason])
    ]
    assert not wrong, "\n".join(wrong)


def test_no_other_page_keeps_a_list_of_the_triggers() -> None:
    """A second list goes stale (design.md had two that disagreed): link to the table."""
    reasons = set(documented_triggers())
    lists: list[str] = []
    for page in sorted([*DOCS.rglob("*.md"), REPO / "README.md"]):
        if page == TRIGGERS_PAGE:
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for group in re.findall(r"\(([^()]*)\)", line):
                items = {item.strip(" `") for item in re.split(r"[|,]", group)}
                if len(items & reasons) >= 3:
                    lists.append(f"{page.relative_to(REPO)}:{number}: ({group})")
    assert not lists, (
        "lists of commit triggers outside the table of "
        f"{TRIGGERS_PAGE.relative_to(REPO)} (link to it instead):\n" + "\n".join(lists)
    )


@pytest.mark.parametrize("page", _design_pages(), ids=lambda page: page.name)
def test_the_paths_a_design_page_names_exist(page: Path) -> None:
    named = {span.rstrip("/") for span in _CODE_SPAN.findall(_prose(page))}
    gone = sorted(path for path in named if _REPO_PATH.match(path) and not (REPO / path).exists())
    assert not gone, f"{page.relative_to(REPO)} names paths that do not exist: {gone}"


def test_the_layout_table_names_every_package() -> None:
    daemon = REPO / "daemon"
    expected = [
        f"daemon/{path.name}/"
        for path in sorted(daemon.iterdir())
        if path.is_dir() and (path / "__init__.py").is_file()
    ] + [
        f"daemon/{path.name}"
        for path in sorted(daemon.glob("*.py"))
        if not path.name.startswith("__")
    ]
    layout = _prose(DESIGN)
    missing = [name for name in expected if f"`{name}`" not in layout]
    assert not missing, f"docs/design.md's layout table does not name {missing}"
