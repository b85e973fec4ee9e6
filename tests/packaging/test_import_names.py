"""The import names: the folders daemon/ and spool/ import as icespool and icespool.spool.

pyproject's package-dir maps them, so a spool/ (or daemon/) folder in the working
directory, a data dir's usual layout, shadows nothing, and python-daemon's ``daemon``
stays its own. The children run the venv's installed icespool (the editable install of a
checkout): the repository root is taken off PYTHONPATH, where its folders would import
under their folder names.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION_LINE = f"icespool {importlib.metadata.version('icespool')}\n"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    keep = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO
    ]
    env.pop("PYTHONPATH", None)
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    return env


def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=60, check=False
    )


def _folders(root: Path, *names: str) -> Path:
    """``root`` holding plain folders (no ``__init__.py``) named ``names``."""
    root.mkdir()
    for name in names:
        (root / name).mkdir()
    return root


@pytest.fixture
def crowded(tmp_path: Path) -> Path:
    cwd = _folders(tmp_path / "crowded", "spool", "daemon", "icespool")
    (cwd / "spool" / "LOCK").touch()  # a spool directory, as the daemon leaves one
    return cwd


def test_python_m_icespool_from_a_cwd_with_package_named_folders(crowded: Path) -> None:
    done = _run(crowded, sys.executable, "-m", "icespool", "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, VERSION_LINE, "")


def test_console_script_from_a_cwd_with_package_named_folders(crowded: Path) -> None:
    script = Path(sys.executable).parent / "icespool"
    assert script.exists(), f"no console script at {script}: is the project installed?"
    done = _run(crowded, str(script), "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, VERSION_LINE, "")


def test_icespool_spool_from_a_cwd_with_package_named_folders(crowded: Path) -> None:
    code = (
        "import icespool.spool; from icespool.spool import Spool, new_uuid7; "
        "print(icespool.spool.__file__); print(Spool.__module__); print(new_uuid7()[14])"
    )
    done = _run(crowded, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    origin, module, version = done.stdout.splitlines()
    assert Path(origin).resolve() == REPO / "spool" / "__init__.py"
    assert (module, version) == ("icespool.spool._spool", "7")


def test_icespool_beside_spool_and_daemon_folders(tmp_path: Path) -> None:
    """The data-dir layout (spool/ beside the process): the top-level package and its lazy
    exports are the project's, not a folder's."""
    cwd = _folders(tmp_path / "data", "spool", "daemon")
    code = (
        "import icespool; from icespool import Icespool, load_config; "
        "print(icespool.__file__); print(Icespool.__module__); print(load_config.__module__)"
    )
    done = _run(cwd, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    origin, service, config = done.stdout.splitlines()
    assert Path(origin).resolve() == REPO / "daemon" / "__init__.py"
    assert (service, config) == ("icespool.lifecycle.service", "icespool.config._load")


def test_daemon_and_spool_are_not_names_icespool_provides(tmp_path: Path) -> None:
    """Nothing of the project imports as ``daemon`` or ``spool``: either name is unknown,
    or another distribution's (python-daemon, when installed)."""
    cwd = _folders(tmp_path / "empty")
    code = (
        "import importlib.util, json\n"
        "specs = {n: importlib.util.find_spec(n) for n in ('daemon', 'spool')}\n"
        "print(json.dumps({n: s and (s.origin or list(s.submodule_search_locations))"
        " for n, s in specs.items()}))"
    )
    done = _run(cwd, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert set(found) == {"daemon", "spool"}
    for name, where in found.items():
        paths = [where] if isinstance(where, str) else (where or [])
        inside = [p for p in paths if Path(p).resolve().is_relative_to(REPO)]
        assert inside == [], f"{name!r} imports from the project: {inside}"
    done = _run(cwd, sys.executable, "-c", "import spool")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'spool'"


def test_pyproject_maps_and_lists_every_package() -> None:
    """setuptools cannot find packages under names other than their folders', so the list
    is explicit: a new subpackage missing from it would be missing from the wheel."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"icespool": "daemon", "icespool.spool": "spool"}
    on_disk = []
    for name, folder in setuptools["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            on_disk.append(".".join([name, *init.parent.relative_to(REPO / folder).parts]))
    assert sorted(setuptools["packages"]) == sorted(on_disk)
