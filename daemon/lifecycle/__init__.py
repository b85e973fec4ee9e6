"""The daemon's life: start, serve, drain, and what it shows about itself (the process
around it, with its signals and HTTP server, is ``icespool.app``).

service      `Icespool`: the spool, its claim, the catalog, tables, sources, shutdown
registry     the tables by name: their writers, loading, creating, degraded ones
leftovers    what runs over the spool's leftovers (start-up, a reloaded table, replay)
startup      loading the catalog at start, and what a start that waits shows
spool_claim  one live process per spool identity (a claim in the catalog)
spool_watch  the spool's quarantine as status and metrics read it
reload       SIGHUP: apply what can change without a restart
status       the figures /v1/status, /metrics, the CLI and systemd read
readiness    the log line when readiness changes
progress     progress of long work (recovery, replay)
sd_notify    systemd's notify protocol
"""
