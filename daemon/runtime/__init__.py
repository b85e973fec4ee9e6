"""How work runs: the keyed worker lanes, the blocking-call executor, bounded fan-out
over many tables, and the one retry helper.

    lanes        work-stealing async workers draining per-key FIFO lanes
    blocking     the event loop's default executor, knowing what still runs
    fanout       per-table work over many tables: bounded, saying how far it got
    retry        bounded attempts with full-jitter exponential backoff
"""
