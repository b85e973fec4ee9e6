"""An AST scan for touches of a library's private names, shared by the fence tests.

A module outside a fence touches ``library``'s internals when it imports a private name
or a private module of it, reaches a private attribute through a name bound to the
library (``update._X``), subclasses one of its classes and overrides a private method,
or, where it imports the library at all, reads an attribute named like one the library
defines privately (``consumer._client``): the caller passes that vocabulary, less what
its own modules define (a ``_lock`` of ours says nothing about whom an access reaches).
"""

from __future__ import annotations

import ast
from pathlib import Path


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_attributes(package_dir: Path) -> set[str]:
    """Private attribute and method names a library's classes define (``self._x = ...``,
    ``def _x``, class-level ``_x``)."""
    names: set[str] = set()
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return {name for name in names if private(name)}


def defined_by(tree: ast.AST) -> set[str]:
    """Private names a module of ours defines itself (its own attributes and methods)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def outside(root: Path, fence: Path | None) -> dict[Path, ast.AST]:
    """Every module under ``root`` but those in ``fence``, parsed."""
    return {
        path: ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(root.rglob("*.py"))
        if fence is None or fence not in path.parents
    }


def touches(where: Path, tree: ast.AST, library: str, vocabulary: set[str]) -> list[str]:
    """Each touch of ``library``'s private names in ``tree``, as ``where:line: what``."""
    found: list[str] = []
    bound: set[str] = set()  # names bound to the library's modules or classes
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == library:
            module = node.module or ""
            if any(private(part) for part in module.split(".")):
                found.append(f"{where}:{node.lineno}: imports from {module}")
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{where}:{node.lineno}: imports {module}.{alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == library:
                    if any(private(part) for part in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno}: imports {alias.name}")
                    bound.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not private(node.attr):
            continue
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in bound:
            found.append(f"{where}:{node.lineno}: {root.id}...{node.attr}")
        elif bound and node.attr in vocabulary:
            # Only where the library is imported: other libraries have private names too.
            found.append(f"{where}:{node.lineno}: .{node.attr} (a {library} private name)")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Name) and base.id in bound for base in node.bases
        ):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and private(item.name):
                    found.append(
                        f"{where}:{item.lineno}: {node.name} overrides {library}'s {item.name}"
                    )
    return found
