"""The controller's core: what a job is and where it may run, with no transport and no store.

`engine_client` (the one interface the edges call), `catalog`, `validation` and `bounds` (what a
request may ask), `router` (workers and assignments), `jobs` (a job's record), `tenants` (quotas
and fair share). It imports the SDK's dataclasses, never protobuf, an engine or an edge.
"""
