"""Which tests must share one xdist worker: the scheduler ``--dist loadgroup`` runs with.

The Spark tests share one JVM and SparkSession per worker (tests/spark/conftest.py), so
they all go to one worker: one JVM start (seconds of CPU, a GB of memory) instead of one
per worker. They were marked ``xdist_group("spark")``, but pytest-xdist 3.8 turns that mark
into the ``@spark`` node-id suffix its scheduler groups by through ``item._nodeid``, which
pytest 9.2's structured node ids no longer read (pytest-dev/pytest-xdist#1386): nothing
failed, the mark was just ignored and both workers started a JVM. The group is decided
here instead, on the controller, from the node id's directory, which needs no suffix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xdist.scheduler import LoadGroupScheduling

__all__ = ["GROUPED_DIRS", "DirectoryGroupScheduling"]

TESTS = Path(__file__).resolve().parents[1]

# Test directory or file -> group name: every test under it runs on one worker. The image
# tests share one image build (tests/ops/test_image.py's module fixture).
GROUPED_DIRS = {TESTS / "spark": "spark", TESTS / "ops" / "test_image.py": "image"}


class DirectoryGroupScheduling(LoadGroupScheduling):
    """``--dist loadgroup``, with every test under a `GROUPED_DIRS` directory in its group
    (a work unit handed to one worker whole; the default --loadscope-reorder hands out the
    biggest unit first, so the Spark group starts at once instead of ending the run)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        root = Path(config.rootpath)
        # A directory's node ids go on with "/", a file's with "::".
        self._prefixes = {
            f"{path.relative_to(root).as_posix()}{'::' if path.suffix == '.py' else '/'}": group
            for path, group in GROUPED_DIRS.items()
        }

    def _split_scope(self, nodeid: str) -> str:
        for prefix, group in self._prefixes.items():
            if nodeid.startswith(prefix):
                return group
        return super()._split_scope(nodeid)
