"""``python -m icespool`` is the ``icespool`` command."""

from icespool.cli import main

raise SystemExit(main())
