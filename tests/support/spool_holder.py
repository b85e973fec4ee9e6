"""Child process for the lock test: opens a spool, says READY, then waits to be killed."""

from __future__ import annotations

import asyncio
import sys

from icespool.spool import Spool


async def main(directory: str) -> None:
    async with Spool(directory):
        print("READY", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
