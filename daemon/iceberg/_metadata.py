"""Table metadata with updates applied; the code lives in the fence around pyiceberg's
internals (``daemon/iceberg/_upstream/_metadata.py``), this path stays importable."""

from icespool.iceberg._upstream._metadata import apply_updates, clock_floor

__all__ = ["apply_updates", "clock_floor"]
