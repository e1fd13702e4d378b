"""The media inputs each task needs.

Read by the controller (refused before queueing) and the worker (a job sent without them is
refused too, never an error inside the pipeline).
"""

from __future__ import annotations

from omnirt.types import MediaRole, Task

REQUIRED_INPUTS: dict[Task, tuple[MediaRole, ...]] = {
    Task.IMAGE2IMAGE: (MediaRole.IMAGE,),
    Task.INPAINT: (MediaRole.IMAGE, MediaRole.MASK),
    Task.IMAGE2VIDEO: (MediaRole.IMAGE,),
    Task.AUDIO2VIDEO: (MediaRole.IMAGE, MediaRole.AUDIO),
}
