"""The controller's core: what a job is and where it may run, with no transport and no store.

`engine_client` (the one interface the edges call), `catalog`, `validation` and `bounds` (what a
request may ask), `batching` (the one batch rule), `router` (workers and assignments), `jobs` (a
job's record and the helpers both engines share), `tenants` (quotas and fair share), `encoded` (the
protobuf-free handle on a result's wire bytes, for the finished-job fast path). It imports the SDK's
dataclasses and omnirt._internal, never protobuf, an engine or an edge.
"""
