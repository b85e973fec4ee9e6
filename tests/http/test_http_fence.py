"""The fence around aiohttp's internals (daemon/http/_upstream/).

- The contract check passes on the installed aiohttp and names what changed in one
  line (the module objects are monkeypatched here; production has no hook for it).
- No module outside the fence touches aiohttp's private names (an AST scan of daemon/).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import aiohttp.web_runner as runner_module
import pytest
from support.private_names import defined_by, outside, private_attributes, touches

from icespool.http._upstream import _contract
from icespool.http._upstream._contract import PINS, UpstreamContractError, check_contract

REPO = Path(__file__).resolve().parents[2]
FENCE = REPO / "daemon" / "http" / "_upstream"
VERSION = aiohttp.__version__


def test_installed_aiohttp_meets_the_contract() -> None:
    assert _contract.problems() == []
    check_contract()


@pytest.mark.parametrize("pin", PINS, ids=lambda pin: pin.target)
def test_each_private_name_is_as_pinned(pin: _contract.Pin) -> None:
    assert _contract.problems([pin]) == []
    assert (FENCE / pin.fence).is_file(), f"{pin.fence} names no module of the fence"


def test_a_changed_name_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    async def stop(self: runner_module.BaseSite) -> None:
        return None  # an upstream whose stop no longer closes _server

    monkeypatch.setattr(runner_module.BaseSite, "stop", stop)
    with pytest.raises(UpstreamContractError) as caught:
        check_contract()
    assert str(caught.value) == (
        f"aiohttp {VERSION}: aiohttp.web_runner.BaseSite.stop no longer uses _server; "
        "icespool's fence daemon/http/_upstream/_site.py needs an update"
    )


def test_a_version_outside_the_tested_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiohttp, "__version__", "3.15.0")
    with pytest.raises(UpstreamContractError) as caught:
        check_contract()
    assert str(caught.value) == (
        "aiohttp 3.15.0: outside the versions icespool's fence daemon/http/_upstream/ was "
        "tested with (>=3.14,<3.15); install a version in that range"
    )


def test_nothing_outside_the_fence_touches_aiohttp_private_names() -> None:
    package = Path(aiohttp.__file__).parent
    vocabulary = private_attributes(package)
    assert {"_ssl_context", "_backlog", "_payload", "_match_info"} <= vocabulary
    found: list[str] = []
    for path, tree in outside(REPO / "daemon", FENCE).items():
        # A private name the module defines for itself says nothing about whom an
        # access reaches; the import and subclass rules still apply.
        own = vocabulary - defined_by(tree)
        found += touches(path.relative_to(REPO), tree, "aiohttp", own)
    assert found == []
