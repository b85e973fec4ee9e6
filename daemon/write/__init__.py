"""The write path: from a decoded batch to a committed Iceberg snapshot, per table.

ingest       the one way in (HTTP, Kafka, Python API): decode, evolve or create, append
writer       `TableWriter`: one table's queue and flush, and the settings they share
queue        spool appends (the ack), pending counts, the flush triggers
flush        seal -> read back -> encode -> commit; strikes and quarantine
cadence      how long past ``batch_timeout`` a table waits while its commits collide
pressure     an append the spool refused for room commits the tables holding it
early_acks   acks while the start waits for the catalog
encode_pool  the threads a flush's heavy work runs in, at a lower priority
"""
