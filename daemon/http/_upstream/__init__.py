"""The fence: the one place icespool reaches into aiohttp's internals.

    _site       TCPSite.start listening through icespool.http._conn's protocol
    _contract   what it relies on, checked here on import

Importing the fence checks the installed aiohttp against ``_contract.PINS`` and raises
``UpstreamContractError`` (one line: the library, its version, what changed, the module
to update). Nothing outside this folder touches aiohttp's private names
(tests/http/test_http_fence.py).
"""

from icespool.http._upstream._contract import UpstreamContractError, check_contract

__all__ = ["UpstreamContractError", "check_contract"]

check_contract()
