"""A daemon config whose ``[catalog]`` is given whole (object stores, Glue, REST), for the
real-daemon harness (``support.daemon_harness.Daemon``): table ``t.events`` (id long
required, v string), HTTP on 127.0.0.1:0, the spool under ``home.root``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from support.daemon_harness import CATALOG_NAME, TABLE, DaemonDir

__all__ = ["write_store_config"]


def write_store_config(home: DaemonDir, catalog: Mapping[str, str | int]) -> Path:
    """Write ``home.config_path``; ``catalog`` holds every key but ``name`` (dotted keys
    such as ``adls.account-name`` are written quoted, as a user writes them)."""
    home.root.mkdir(parents=True, exist_ok=True)
    lines = [f"{json.dumps(key)} = {json.dumps(value)}" for key, value in catalog.items()]
    text = f"""\
[catalog]
name = "{CATALOG_NAME}"
{chr(10).join(lines)}

[spool]
dir = {json.dumps(str(home.spool_dir))}

[http]
listen = "127.0.0.1:0"

[defaults]
batch_timeout = "60s"

[encode]
workers = 2

[log]
level = "info"
format = "text"

[[tables]]
name = "{TABLE}"
create = true
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "v", type = "string" }},
]
"""
    home.config_path.write_text(text)
    return home.config_path
