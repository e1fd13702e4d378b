"""Run a module under cProfile timed by its main thread's CPU clock; the profile is written when
the module returns (a daemon that drains on SIGTERM and returns from main).

    python -m bench._profiled OUT.prof omnirt.controller.main --listen ...

The main thread's CPU clock (`time.thread_time`), not wall time: on a shared machine a wall
clock charges to whatever frame was running the time the process waited for a core, and the
asyncio loop's time blocked in epoll is no cost. gRPC's own threads are not in the profile.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    out, module, *rest = sys.argv[1:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
