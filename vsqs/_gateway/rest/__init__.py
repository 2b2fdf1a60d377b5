"""The native face of the gateway: JSON over REST under ``/queues``, plus a raw
mode for single messages in the spirit of the header-based HTTP queues.

Every handler makes public vsqs calls through ``gateway.call`` (on the thread
pool) and lets vsqs errors rise: ``vsqs._gateway.errors`` turns them into
statuses in one place (404 unknown queue, 400 malformed receipt, 409 stale receipt, 413 too
large, 422 bad value naming the parameter, 429 full or throttled, 503
suspended, 507 disk full).

Its modules: docs/ARCHITECTURE.md.
"""
