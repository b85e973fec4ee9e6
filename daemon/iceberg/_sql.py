"""The SQL catalog's commits; the code lives in the fence around pyiceberg's internals
(``daemon/iceberg/_upstream/_sql.py``), this path stays importable."""

from icespool.iceberg._upstream._sql import IcespoolSqlCatalog, current_location

__all__ = ["IcespoolSqlCatalog", "current_location"]
