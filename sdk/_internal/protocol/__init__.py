"""The controller <-> worker protocol (proto package `omnirt.worker.v1`, internal).

It lives where both daemons stand: its generated code (`v1/`), its one set of dataclasses
(`messages`) and one converter each way (`convert`); a realtime session's own streams
(RealtimeService.Session, WorkerSession) likewise in `realtime`. Neither daemon imports the
other's code.
"""
