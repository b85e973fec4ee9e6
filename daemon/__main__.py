"""``python -m daemon`` is the ``icespool`` command."""

from daemon.cli import main

raise SystemExit(main())
