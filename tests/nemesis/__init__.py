"""The nemesis: real `icespool run` replicas on shared tables, faulted together at random
moments by a seeded schedule, then healed and checked record by record.

    catalogue   the kinds of fault, and how each is injected and healed
    schedule    the faults of one run, drawn from a seed (the same seed, the same faults)
    world       the servers, the tables, and the replicas with every part a fault touches
    actors      who writes: producers over HTTP and Kafka recording every ack, and an
                outside writer expiring and compacting the tables with pyiceberg
    recorder    the history of a run: acks, faults, commits seen, process exits
    reader      the tables read back without the daemon's code
    checker     the verdict: every acked record exactly once, upserts equal to a model
    runner      one run: start, fault, heal, drain, check; ``python -m nemesis``

docs/guarantees.md ("The nemesis") says what it injects, what it checks and how to run it.
"""
