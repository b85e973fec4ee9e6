"""Arrow IPC stream bodies -> tables, as they are."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from icespool.decode._locate import _first_line
from icespool.errors import BadInputError, SchemaError
from icespool.schema import find_out_of_range


def decode_arrow_stream(body: bytes) -> pa.Table:
    """Read an Arrow IPC stream as it is; `icespool.write.ingest` conforms it to the table
    (evolving the table where its policy allows) and names a failing column."""
    if not body:
        raise BadInputError("no records: the body is empty; send an Arrow IPC stream")
    source = pa.BufferReader(body)
    try:
        with ipc.open_stream(source) as reader:
            table = reader.read_all()
        # The body comes from the network: offsets and lengths inside it must be
        # checked before any kernel trusts them, or a crafted stream reads out of bounds.
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        raise BadInputError(
            f"the body is not a valid Arrow IPC stream ({_first_line(str(exc))}); send "
            "the bytes of a pyarrow.ipc.new_stream writer with "
            "Content-Type application/vnd.apache.arrow.stream"
        ) from exc
    if source.tell() < len(body):
        # The reader stops at the end-of-stream marker: a second stream appended
        # to the first (or junk) would be dropped while the client counts it sent.
        raise BadInputError(
            f"{len(body) - source.tell()} bytes follow the end of the Arrow stream (two "
            "streams in one body?); send one stream per request"
        )
    if table.num_rows == 0:
        raise BadInputError("no records: the Arrow stream holds no rows")
    for name, values in zip(table.column_names, table.columns, strict=True):
        found = find_out_of_range(values)
        if found is not None:
            where = f" (row {found.row + 1})" if found.row >= 0 else ""
            raise SchemaError(found.column(name), f"{found.problem}{where}").because("out_of_range")
    return table
