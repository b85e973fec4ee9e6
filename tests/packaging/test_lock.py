"""The lock (requirements/*.txt, made by `make lock`) agrees with pyproject.toml.

A requirement added to pyproject.toml, or a bound moved past a locked version, without
`make lock` turns these red: every install (Makefile, Dockerfile) reads only the lock.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# The interpreters the lock is resolved for (`--universal`, Python >= 3.11) on Linux,
# where the Makefile and the image install it.
ENVIRONMENTS = [
    {
        "python_version": version,
        "python_full_version": f"{version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "os_name": "posix",
    }
    for version in ("3.11", "3.12", "3.13")
    for machine in ("x86_64", "aarch64")
]


@dataclass(frozen=True)
class Pin:
    name: str
    version: Version
    marker: Marker | None
    hashes: int

    def applies(self, env: dict[str, str]) -> bool:
        return self.marker is None or self.marker.evaluate(env)


_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)"
    r"(?: ; (?P<marker>[^\\]+?))?\s*$"
)


def read_lock(path: Path) -> list[Pin]:
    """The pins of one lock file: `name==version [; marker]` then its --hash lines."""
    pins: list[Pin] = []
    entries = re.split(r"\n(?=[A-Za-z0-9])", path.read_text())
    for entry in entries:
        if entry.startswith("#"):
            continue
        head = entry.split("\\\n", 1)[0]
        match = _PIN.match(head.strip().rstrip("\\").strip())
        assert match is not None, f"{path.name}: not a pin: {head!r}"
        marker = match.group("marker")
        pins.append(
            Pin(
                canonicalize_name(match.group("name")),
                Version(match.group("version")),
                Marker(marker) if marker else None,
                entry.count("--hash=sha256:"),
            )
        )
    return pins


def lock_extras() -> dict[str, list[str]]:
    """Each lock file of the Makefile's `lock` target and the extras it is resolved with."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    recipe = makefile.split("\nlock: ", 1)[1].split("\n\n", 1)[0]
    locks: dict[str, list[str]] = {}
    for command in recipe.splitlines()[1:]:
        if "pyproject.toml" not in command:
            continue
        output = re.search(r"-o \$\(LOCK\)/(\S+)", command)
        assert output is not None, command
        locks[output.group(1)] = re.findall(r"--extra (\S+)", command)
    return locks


def required(extras: list[str]) -> list[Requirement]:
    """pyproject's requirements for ``extras`` (the project's own extras expanded)."""
    project = PYPROJECT["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    found = [Requirement(r) for r in project["dependencies"]]
    pending = list(extras)
    seen: set[str] = set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "icespool":
                pending.extend(requirement.extras)
            else:
                found.append(requirement)
    return found + [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]


def check(pins: list[Pin], requirements: list[Requirement]) -> list[str]:
    """What is wrong: a requirement without a pin, or a pin outside its bounds."""
    problems = []
    for env in ENVIRONMENTS:
        here = {p.name: p for p in pins if p.applies(env)}
        for requirement in requirements:
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            pin = here.get(canonicalize_name(requirement.name))
            where = f"Python {env['python_version']} {env['platform_machine']}"
            if pin is None:
                problems.append(f"{requirement} is not locked ({where})")
            elif not requirement.specifier.contains(pin.version, prereleases=True):
                problems.append(f"{requirement.name}=={pin.version} violates {requirement}")
    return sorted(set(problems))


LOCKS = lock_extras()


def test_the_makefile_makes_the_locks_the_installs_read() -> None:
    assert LOCKS == {
        "test.txt": ["test", "spark", "demo"],
        "run.txt": [],
        "demo.txt": ["demo"],
        "docs.txt": ["docs"],
        "image.txt": ["glue", "azure", "hive"],
    }
    makefile = (ROOT / "Makefile").read_text()
    for name in ("test.txt", "run.txt", "demo.txt", "docs.txt", "helm-sdkpy.txt"):
        assert f"$(PIP_LOCKED) $(LOCK)/{name}" in makefile, name
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG ICESPOOL_LOCK=image.txt" in dockerfile
    assert '--require-hashes --no-deps -r "requirements/${ICESPOOL_LOCK}"' in dockerfile


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_lock_covers_pyproject(name: str) -> None:
    pins = read_lock(LOCK / name)
    assert len(pins) > 30
    assert check(pins, required(LOCKS[name])) == []
    # --require-hashes refuses a pin without one.
    assert [p.name for p in pins if p.hashes == 0] == []


@pytest.mark.parametrize("name", sorted(set(LOCKS) - {"test.txt"}))
def test_smaller_locks_pin_what_the_suite_runs(name: str) -> None:
    tested, pins = read_lock(LOCK / "test.txt"), read_lock(LOCK / name)
    for env in ENVIRONMENTS:
        versions = {p.name: p.version for p in tested if p.applies(env)}
        assert {
            p.name: p.version for p in pins if p.applies(env)
        }.items() - versions.items() == set()


def test_helm_sdkpy_pin_is_the_one_tested_on_newer_pythons() -> None:
    (pin,) = read_lock(LOCK / "helm-sdkpy.txt")
    tested = [p for p in read_lock(LOCK / "test.txt") if p.name == "helm-sdkpy"]
    assert [(p.version, str(p.marker)) for p in tested] == [
        (pin.version, 'python_full_version >= "3.12"')
    ]


def test_build_in_is_the_build_systems_requires() -> None:
    lines = (LOCK / "build.in").read_text().splitlines()
    assert [ln for ln in lines if ln and not ln.startswith("#")] == PYPROJECT["build-system"][
        "requires"
    ]


def test_the_check_catches_a_forgotten_make_lock() -> None:
    pins = read_lock(LOCK / "run.txt")
    aiohttp = next(p for p in pins if p.name == "aiohttp")
    # A new dependency, and a bound moved past the locked version.
    assert check(pins, [Requirement("left-pad-nonexistent>=1")]) == [
        "left-pad-nonexistent>=1 is not locked (Python 3.11 aarch64)",
        "left-pad-nonexistent>=1 is not locked (Python 3.11 x86_64)",
        "left-pad-nonexistent>=1 is not locked (Python 3.12 aarch64)",
        "left-pad-nonexistent>=1 is not locked (Python 3.12 x86_64)",
        "left-pad-nonexistent>=1 is not locked (Python 3.13 aarch64)",
        "left-pad-nonexistent>=1 is not locked (Python 3.13 x86_64)",
    ]
    bumped = f"aiohttp>{aiohttp.version}"
    assert check(pins, [Requirement(bumped)]) == [f"aiohttp=={aiohttp.version} violates {bumped}"]
