"""Types of the shared fixtures, importable by test modules.

Test modules must not import ``conftest``: with several conftest.py files
(tests/, tests/spark/) the name resolves to whichever pytest loaded first.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from daemon.config import Config
from daemon.service import Icespool

__all__ = ["MakeConfig", "RunDaemon"]

MakeConfig = Callable[..., Config]
RunDaemon = Callable[..., AbstractAsyncContextManager[tuple[Icespool, str]]]
