"""Package names imported on first use (a module ``__getattr__``, PEP 562).

A package whose submodules pull in pyarrow, pyiceberg, aiokafka or aiohttp's server
re-exports its names through `lazy_exports`: importing the package, or one light
submodule of it (the config model's type grammar, the CLI's HTTP client), then costs
only that submodule, so ``icespool status`` or ``check-config`` start in a fraction of
the daemon's import time and an HTTP-only daemon never imports the Kafka client. The
package keeps its eager imports under ``TYPE_CHECKING`` for the type checker.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]

#: A name exported as itself, or (exported name, the submodule's name for it).
Export = str | tuple[str, str]


def lazy_exports(package: str, exports: Mapping[str, Sequence[Export]]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``exports`` (submodule -> names)
    is imported from its submodule when first asked for, then kept on the package."""
    where: dict[str, tuple[str, str]] = {}
    for module, names in exports.items():
        for name in names:
            exported, attribute = (name, name) if isinstance(name, str) else name
            where[exported] = (module, attribute)

    def __getattr__(name: str) -> Any:
        try:
            module, attribute = where[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
