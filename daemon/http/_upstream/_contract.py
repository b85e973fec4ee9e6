"""What the fence relies on in aiohttp, checked when the fence is imported.

``PINS`` lists what `_site` relies on in aiohttp's ``BaseSite`` beyond its public API;
the version must lie in the range the suite ran against (pyproject.toml pins the same).
``check_contract`` raises ``UpstreamContractError`` with one line (the machinery is
shared with the other fences: ``icespool._upstream_contract``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from icespool import _upstream_contract as contract
from icespool._upstream_contract import Pin, UpstreamContractError, accepts, uses

__all__ = ["FENCE", "PINS", "Pin", "UpstreamContractError", "check_contract", "problems"]

#: The versions the suite ran against: >=3.14, <3.15.
FENCE: Final = contract.Fence("aiohttp", "daemon/http/_upstream/", ((3, 14), (3, 15)))

_RUNNER = "aiohttp.web_runner"

PINS: Final[tuple[Pin, ...]] = (
    Pin(
        "_site.py",
        f"{_RUNNER}.BaseSite.__init__",
        (accepts("runner", "ssl_context", "backlog"), uses("_ssl_context", "_backlog", "_server")),
    ),
    Pin("_site.py", f"{_RUNNER}.BaseSite.stop", (uses("_server"),)),
    Pin("_site.py", f"{_RUNNER}.TCPSite.start", (uses("_server", "_ssl_context", "_backlog"),)),
    Pin("_site.py", f"{_RUNNER}.BaseRunner.addresses", ()),
)


def problems(pins: Iterable[Pin] = PINS) -> list[str]:
    """What changed, one line per broken check of ``pins`` (the fence module named)."""
    return contract.problems(FENCE, pins)


def check_contract(pins: Iterable[Pin] = PINS) -> None:
    """Raise UpstreamContractError (one line) unless the installed aiohttp has what
    ``pins`` rely on, in a version the suite ran against."""
    contract.check_contract(FENCE, pins)
