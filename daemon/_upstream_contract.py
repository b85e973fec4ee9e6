"""What a fence relies on in a library's internals, checked when the fence is imported.

A fence is one folder holding every place icespool extends or replaces a library's
non-public API (``daemon/iceberg/_upstream/`` for pyiceberg, ``daemon/kafka/_upstream/``
for aiokafka). Its ``_contract`` module lists `Pin`\\ s, per fence module: a private
name exists, takes the parameters it took, is the kind of object it was, uses the
attributes it used (read from its code object, no call), and so on; and the version
range of the library the suite ran against (`Fence`).

`check_contract` raises `UpstreamContractError` with one line: the library, the
version, what changed, and the fence module to update. It reads the installed modules
as they are at call time and calls nothing of theirs. This module imports no library
it checks: each fence's contract names its own.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from icespool.errors import IcespoolError

__all__ = [
    "Check",
    "Fence",
    "Pin",
    "UpstreamContractError",
    "accepts",
    "check_contract",
    "columns",
    "equals",
    "fields",
    "handles",
    "has",
    "in_range",
    "kind",
    "locals_named",
    "params",
    "private_attributes",
    "problems",
    "says",
    "uses",
    "uses_exactly",
]

Check = Callable[[Any], "str | None"]


class UpstreamContractError(IcespoolError):
    """The installed library no longer has what a fence relies on."""


@dataclass(frozen=True)
class Fence:
    """A fence around ``library``'s internals: its folder (for the messages) and the
    versions the suite ran against, ``[low, high)`` as (major, minor)."""

    library: str
    folder: str
    tested: tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Pin:
    """``target`` (a dotted path into the library) as ``fence`` (a module of the fence)
    relies on it; each check returns what changed, or None."""

    fence: str
    target: str
    checks: tuple[Check, ...] = ()


def params(*names: str) -> Check:
    """The callable's first parameters are ``names``, in that order."""

    def check(obj: Any) -> str | None:
        try:
            found = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return "has no signature to read"
        if found[: len(names)] != names:
            return f"no longer takes ({', '.join(names)}) but ({', '.join(found)})"
        return None

    return check


def accepts(*names: str) -> Check:
    """The callable takes each of ``names`` (by keyword: the order does not matter)."""

    def check(obj: Any) -> str | None:
        try:
            found = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return "has no signature to read"
        missing = [name for name in names if name not in found]
        return f"no longer takes {', '.join(missing)}" if missing else None

    return check


def _code(obj: Any) -> Any:
    return getattr(inspect.unwrap(obj), "__code__", None)


def uses(*names: str) -> Check:
    """The function's code reads or sets each of ``names`` (attribute or global)."""

    def check(obj: Any) -> str | None:
        code = _code(obj)
        if code is None:
            return "is no Python function"
        missing = [name for name in names if name not in code.co_names]
        return f"no longer uses {', '.join(missing)}" if missing else None

    return check


def uses_exactly(*names: str) -> Check:
    """The function's code uses exactly ``names``: a step added or dropped upstream
    changes the set."""

    def check(obj: Any) -> str | None:
        code = _code(obj)
        if code is None:
            return "is no Python function"
        found, wanted = set(code.co_names), set(names)
        if found == wanted:
            return None
        changes = [f"+{name}" for name in sorted(found - wanted)]
        changes += [f"-{name}" for name in sorted(wanted - found)]
        return f"changed its steps ({', '.join(changes)})"

    return check


def says(*texts: str) -> Check:
    """The function's code holds each of ``texts`` as a string constant (a log format
    or an error message a fence matches)."""

    def check(obj: Any) -> str | None:
        code = _code(obj)
        if code is None:
            return "is no Python function"
        found = {c for c in code.co_consts if isinstance(c, str)}
        missing = [text for text in texts if text not in found]
        return f"no longer says {', '.join(repr(t) for t in missing)}" if missing else None

    return check


def locals_named(*names: str) -> Check:
    """The function has local variables ``names`` (read from its frame by a fence)."""

    def check(obj: Any) -> str | None:
        code = _code(obj)
        if code is None:
            return "is no Python function"
        missing = [name for name in names if name not in code.co_varnames]
        return f"no longer has the local {', '.join(missing)}" if missing else None

    return check


def equals(expected: object) -> Check:
    """The object (a module constant) is ``expected``."""

    def check(obj: Any) -> str | None:
        return None if obj == expected else f"is {obj!r}, no longer {expected!r}"

    return check


def kind(expected: type) -> Check:
    """The object is an instance of ``expected`` (a property, a staticmethod...)."""

    def check(obj: Any) -> str | None:
        if isinstance(obj, expected):
            return None
        return f"is no longer a {expected.__module__}.{expected.__qualname__}"

    return check


def handles(*type_names: str) -> Check:
    """A singledispatch function's registered types are exactly ``type_names``."""

    def check(obj: Any) -> str | None:
        registry = getattr(obj, "registry", None)
        if registry is None:
            return "is no longer a singledispatch function"
        found, wanted = {t.__name__ for t in registry}, set(type_names)
        if found == wanted:
            return None
        changes = [f"+{name}" for name in sorted(found - wanted)]
        changes += [f"-{name}" for name in sorted(wanted - found)]
        return f"handles other update types ({', '.join(changes)})"

    return check


def has(*names: str) -> Check:
    """The object has each of ``names`` as an attribute."""

    def check(obj: Any) -> str | None:
        missing = [name for name in names if not hasattr(obj, name)]
        return f"has no {', '.join(missing)}" if missing else None

    return check


def private_attributes(*names: str) -> Check:
    """A pydantic model declares each of ``names`` as a private attribute."""

    def check(obj: Any) -> str | None:
        found = getattr(obj, "__private_attributes__", {})
        missing = [name for name in names if name not in found]
        return f"has no pydantic private attribute {', '.join(missing)}" if missing else None

    return check


def fields(*names: str) -> Check:
    """A pydantic model has each of ``names`` as a field."""

    def check(obj: Any) -> str | None:
        found = getattr(obj, "model_fields", {})
        missing = [name for name in names if name not in found]
        return f"has no field {', '.join(missing)}" if missing else None

    return check


def columns(*names: str) -> Check:
    """A SQLAlchemy model's table has each of ``names`` as a column."""

    def check(obj: Any) -> str | None:
        table = getattr(obj, "__table__", None)
        found = {column.name for column in table.columns} if table is not None else set()
        missing = [name for name in names if name not in found]
        return f"has no column {', '.join(missing)}" if missing else None

    return check


def _resolve(target: str) -> Any:
    """The object at ``target``, from the package down: attributes first, a submodule
    imported only where no attribute has the name (a failed import costs a path search).
    Class attributes are read raw from ``__dict__`` along the MRO, so a property stays a
    property."""
    first, *rest = target.split(".")
    obj: Any = importlib.import_module(first)
    for name in rest:
        try:
            obj = _attribute(obj, name)
        except LookupError:
            if not inspect.ismodule(obj):
                raise
            try:
                obj = importlib.import_module(f"{obj.__name__}.{name}")
            except ImportError:
                raise LookupError(name) from None
    return obj


def _attribute(obj: Any, name: str) -> Any:
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        raise LookupError(name)
    try:
        return getattr(obj, name)
    except AttributeError:
        raise LookupError(name) from None


def version(fence: Fence) -> str:
    """The installed version of the fence's library."""
    module = importlib.import_module(fence.library)
    return str(getattr(module, "__version__", "unknown"))


def in_range(fence: Fence, found: str) -> bool:
    """Whether version ``found`` lies in the range the fence was tested with."""
    match = re.match(r"(\d+)\.(\d+)", found)
    if match is None:
        return False
    major_minor = (int(match.group(1)), int(match.group(2)))
    low, high = fence.tested
    return low <= major_minor < high


def problems(fence: Fence, pins: Iterable[Pin]) -> list[str]:
    """What changed, one line per broken check of ``pins`` (the fence module named)."""
    found: list[str] = []
    for pin in pins:
        where = f"icespool's fence {fence.folder}{pin.fence}"
        try:
            obj = _resolve(pin.target)
        except LookupError:
            found.append(f"{pin.target} is gone; {where}")
            continue
        for check in pin.checks:
            problem = check(obj)
            if problem is not None:
                found.append(f"{pin.target} {problem}; {where}")
    return found


def check_contract(fence: Fence, pins: Iterable[Pin]) -> None:
    """Raise UpstreamContractError (one line) unless the installed library has what
    ``pins`` rely on, in a version the suite ran against."""
    installed = version(fence)
    if not in_range(fence, installed):
        (low_major, low_minor), (high_major, high_minor) = fence.tested
        raise UpstreamContractError(
            f"{fence.library} {installed}: outside the versions icespool's fence "
            f"{fence.folder} was tested with (>={low_major}.{low_minor},"
            f"<{high_major}.{high_minor}); install a version in that range"
        )
    found = problems(fence, pins)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UpstreamContractError(
            f"{fence.library} {installed}: {found[0]} needs an update{more}"
        )
