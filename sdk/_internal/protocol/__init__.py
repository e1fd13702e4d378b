"""The controller <-> worker protocol (proto package `omnirt.worker.v1`, internal).

It lives where both daemons stand: its generated code (`v1/`), its one set of dataclasses
(`messages`) and one converter each way (`convert`). Neither daemon imports the other's code.
"""
