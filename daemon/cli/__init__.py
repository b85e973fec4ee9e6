"""The ``icespool`` command.

_main     argument parsing and the subcommands (run, replay, check-config,
          spark-conf, status, tables, dead-letters)
_client   asking a running daemon over HTTP (URL, token, CA, timeout, errors)
_view     the human views of ``status`` and ``tables``
_dead_letters  ``dead-letters list``: a dead-letter table by target and reason
"""

from icespool.cli._main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, build_parser, main

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]
