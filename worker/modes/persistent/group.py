"""`ResidentGroup`: the supervised, resident process group of one model.

A supervisor thread owns the group's lifecycle (it is the only thread that starts or stops
it, and the parent-death signal of the torchrun agent is tied to it):

- STOPPED -> STARTING when a request wants the group; READY once rank 0 reports ready.
  A failed start leaves it STOPPED and fails the requests waiting for it; the next start
  waits out the backoff.
- READY -> RESTARTING when the agent exits unexpectedly (a rank died: torchrun tears the
  rest down) or a request finds rank 0 gone or silent; the group is started again after
  `restart_backoff_s`, doubling per consecutive failure up to `restart_backoff_max_s`. A
  request served to the end resets the backoff.
- READY -> STOPPED after `idle_unload_s` without requests (0 = never; never while a realtime
  session holds the group, `hold`), and on `close()`.

Requests are served one at a time (rank 0 runs one job at a time). The first request after
each (re)start is cold: it gets the start record (spawn + dist init + model load timing); so is
a request that had to wait for a start. A start asked for by `preload()` (the worker's
`--preload`, before any request) is nobody's: the first request that finds it ready is warm.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnirt.worker.modes.persistent import channel
from omnirt.worker.modes.persistent.launch import GroupError, Launch, LaunchSpec

log = logging.getLogger("omnirt.worker.modes.persistent")

_TICK_S = 0.1


class State(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    CLOSED = "closed"


@dataclass(frozen=True)
class StartRecord:
    """One successful start: perf_counter times and rank 0's report."""

    generation: int
    started: float
    ready_at: float
    init_ms: float
    model_ms: float
    world_size: int
    pipeline_class: str
    pids: tuple[int, ...]

    @property
    def load_ms(self) -> float:
        """Group start to ready: spawn, dist init and model load on every rank."""
        return (self.ready_at - self.started) * 1000.0


@dataclass(frozen=True)
class Lease:
    """A request's hold on a ready group; `cold` for the first request after a (re)start."""

    record: StartRecord
    cold: bool


class ResidentGroup:
    """Starts, serves through, restarts and stops one model's process group."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.settings = spec.settings
        self._cond = threading.Condition()
        self._request_lock = threading.Lock()
        self._state = State.STOPPED
        self._launch: Launch | None = None
        self._record: StartRecord | None = None
        self._fresh = False
        # The next start is a preload's: its first request does not pay for it.
        self._unclaimed_start = False
        self._wanted = False
        self._busy = False
        self._holds = 0  # open realtime sessions: their state lives on the ranks
        self._last_used = time.monotonic()
        self._not_before = 0.0
        self._failures = 0  # consecutive, for the backoff
        self._start_errors = 0  # total, so waiters can tell a new failure
        self._last_error: GroupError | None = None
        self._starting: Launch | None = None  # killed by close() if it is still starting
        self.generation = 0
        self._thread = threading.Thread(
            target=self._supervise, name=f"omnirt-pw-{spec.model_id}", daemon=True
        )
        self._thread.start()

    def update(self, spec: LaunchSpec) -> None:
        """Take new idle, timeout and backoff settings (same `launch_key`) without a restart."""
        with self._cond:
            self.spec, self.settings = spec, spec.settings
            self._cond.notify_all()

    # ---- what others read ----------------------------------------------------------------

    @property
    def state(self) -> State:
        with self._cond:
            return self._state

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def in_use(self) -> bool:
        """A request runs on the group, or an open session holds it."""
        with self._cond:
            return self._busy or self._holds > 0

    def pids(self) -> list[int]:
        """The torchrun agent's and the ranks' pids of the running group (empty when down)."""
        with self._cond:
            launch = self._launch
        if launch is None or launch.agent is None:
            return []
        return [launch.agent.pid, *launch.rank_pids]

    def hold(self) -> None:
        """Keep the group from idling out (an open session); undone by `release`."""
        with self._cond:
            self._holds += 1

    def release(self) -> None:
        """Undo one `hold`; the idle time counts from now."""
        with self._cond:
            self._holds = max(0, self._holds - 1)
            self._last_used = time.monotonic()
            self._cond.notify_all()

    # ---- requests ------------------------------------------------------------------------

    def run(
        self,
        work: dict[str, Any],
        on_progress: Callable[[int, int, list[Any]], bool],
        on_wait: Callable[[], None],
        should_abort: Callable[[], str | None],
        on_dispatch: Callable[[Lease], None] | None = None,
    ) -> tuple[Lease, dict[str, Any]]:
        """Run `work` (`{"job": ...}` or `{"jobs": [...]}`, or a session op with its own
        `"op"`) on the group, through rank 0 (waiting for the group to be ready first).

        `on_wait` is called once if the request has to wait for a start; `should_abort`
        (polled while waiting) returns a reason to give up; `on_dispatch(lease)` is called
        just before the job is sent to rank 0. Raises GroupError when the group
        cannot start or dies during the job, `Aborted` when `should_abort` said so.
        """
        with self._request_lock:
            lease = self._acquire(on_wait, should_abort)
            with self._cond:
                launch = self._launch
                self._busy = True
            try:
                assert launch is not None
                if on_dispatch is not None:
                    on_dispatch(lease)
                reply = launch.request(work, on_progress)
            except (channel.ChannelClosed, TimeoutError, OSError) as exc:
                what = "stopped answering" if isinstance(exc, TimeoutError) else "died"
                self._lost(launch, f"rank 0 {what} during the job ({exc})")
                time.sleep(0.1)  # let torchrun print why
                tail = launch.last_lines(4) if launch is not None else ""
                raise GroupError(
                    f"the process group of model {self.spec.model_id!r} {what} while running the job; "
                    f"it is being restarted ({tail})"
                ) from exc
            finally:
                with self._cond:
                    self._busy = False
                    self._last_used = time.monotonic()
                    self._cond.notify_all()
            with self._cond:
                self._failures = 0
            return lease, reply

    def _acquire(self, on_wait: Callable[[], None], should_abort: Callable[[], str | None]) -> Lease:
        waited = False
        with self._cond:
            seen_errors = self._start_errors
            deadline = time.monotonic() + self.settings.start_timeout_s + self.settings.restart_backoff_max_s
            while True:
                if self._state is State.CLOSED:
                    raise GroupError("the worker is shutting down")
                if self._state is State.READY and self._record is not None:
                    # Cold: the first request after a (re)start, or one that waited for a start.
                    cold, self._fresh = self._fresh or waited, False
                    return Lease(self._record, cold)
                if self._start_errors > seen_errors and self._last_error is not None:
                    raise self._last_error
                reason = should_abort()
                if reason:
                    raise Aborted(reason)
                if time.monotonic() > deadline:
                    raise GroupError(
                        f"the process group of model {self.spec.model_id!r} is not ready in time"
                    )
                if not waited:
                    waited = True
                    self._cond.release()
                    try:
                        on_wait()
                    finally:
                        self._cond.acquire()
                    continue
                self._wanted = True
                self._cond.notify_all()
                self._cond.wait(_TICK_S)

    def preload(self) -> None:
        """Start the group now, before any request, and return once it is ready.

        A group started this way is warm for its first request (nobody waited for it); a request
        that arrives while it is still starting waits and is cold. Raises GroupError when the
        start fails or does not finish within `start_timeout_s`.
        """
        with self._cond:
            if self._state is State.READY:
                return
            if self._state is State.STOPPED:
                self._unclaimed_start = True
            seen_errors = self._start_errors
            deadline = time.monotonic() + self.settings.start_timeout_s + self.settings.restart_backoff_max_s
            while self._state is not State.READY:
                if self._state is State.CLOSED:
                    raise GroupError("the worker is shutting down")
                if self._start_errors > seen_errors and self._last_error is not None:
                    raise self._last_error
                if time.monotonic() > deadline:
                    raise GroupError(
                        f"the process group of model {self.spec.model_id!r} is not ready in time"
                    )
                self._wanted = True
                self._cond.notify_all()
                self._cond.wait(_TICK_S)

    # ---- the supervisor ------------------------------------------------------------------

    def _lost(self, launch: Launch | None, why: str) -> None:
        """The running group is broken: kill what is left; the supervisor restarts it."""
        with self._cond:
            if launch is not self._launch or launch is None or self._state is not State.READY:
                return
            self._launch = None
            self._enter_restart(why)
        launch.stop(grace_s=0.0)

    def _enter_restart(self, why: str) -> None:
        # Called with the lock held.
        self._failures += 1
        delay = min(
            self.settings.restart_backoff_s * 2 ** (self._failures - 1), self.settings.restart_backoff_max_s
        )
        self._not_before = time.monotonic() + delay
        self._state = State.RESTARTING
        log.error(
            "model %s: process group down (%s); restart %d in %.1f s",
            self.spec.model_id,
            why,
            self._failures,
            delay,
        )
        self._cond.notify_all()

    def _supervise(self) -> None:
        while True:
            action = self._next_action()
            if action == "exit":
                with self._cond:
                    launch, self._launch = self._launch, None
                if launch is not None:
                    launch.stop()
                return
            if action == "start":
                self._start()
            elif action in ("stop", "unload", "dead"):
                self._stop(action)

    def _next_action(self) -> str:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._state is State.CLOSED:
                    return "exit"
                if self._state is State.READY:
                    launch = self._launch
                    if launch is not None and not launch.alive():
                        return "dead"
                    idle = self.settings.idle_unload_s
                    if idle > 0 and not self._busy and not self._holds and now - self._last_used >= idle:
                        return "unload"
                elif now >= self._not_before and (
                    self._state is State.RESTARTING or (self._state is State.STOPPED and self._wanted)
                ):
                    return "start"
                self._cond.wait(_TICK_S)

    def _start(self) -> None:
        with self._cond:
            restarting = self._state is State.RESTARTING
            self._state = State.STARTING
            self.generation += 1
            generation = self.generation
        started = time.perf_counter()
        launch = Launch(self.spec)
        with self._cond:
            self._starting = launch
        log.info(
            "model %s: starting its process group (%d ranks, %s)%s",
            self.spec.model_id,
            self.settings.nproc_per_node,
            self.settings.dist_backend,
            " after a failure" if restarting else "",
        )
        try:
            launch.start()
        except GroupError as exc:
            with self._cond:
                self._starting = None
            log.error("model %s: the process group failed to start: %s", self.spec.model_id, exc)
            with self._cond:
                self._last_error = exc
                self._start_errors += 1
                self._wanted = self._unclaimed_start = False
                if self._state is State.STARTING:
                    self._failures += 1
                    delay = min(
                        self.settings.restart_backoff_s * 2 ** (self._failures - 1),
                        self.settings.restart_backoff_max_s,
                    )
                    self._not_before = time.monotonic() + delay
                    # After a crash keep trying (like a crash-loop backoff); a first start that
                    # fails waits for the next request.
                    self._state = State.RESTARTING if restarting else State.STOPPED
                self._cond.notify_all()
            return
        ready = launch.ready
        record = StartRecord(
            generation=generation,
            started=started,
            ready_at=time.perf_counter(),
            init_ms=float(ready.get("init_ms", 0.0)),
            model_ms=float(ready.get("model_ms", 0.0)),
            world_size=int(ready.get("world_size", 1)),
            pipeline_class=str(ready.get("pipeline_class", "")),
            pids=tuple(launch.rank_pids),
        )
        with self._cond:
            self._starting = None
            if self._state is not State.STARTING:  # closed meanwhile
                closing = True
            else:
                closing = False
                self._launch, self._record = launch, record
                self._fresh, self._unclaimed_start = not self._unclaimed_start, False
                self._state, self._wanted = State.READY, False
                self._last_used = time.monotonic()
                self._cond.notify_all()
        if closing:
            launch.stop()
            return
        log.info(
            "model %s: process group ready in %.0f ms (dist init %.0f ms, model load %.0f ms, ranks %s)",
            self.spec.model_id,
            record.load_ms,
            record.init_ms,
            record.model_ms,
            list(record.pids),
        )

    def _stop(self, why: str) -> None:
        with self._cond:
            launch, self._launch = self._launch, None
            if why == "dead":
                status = launch.agent.poll() if launch is not None and launch.agent is not None else None
                self._enter_restart(f"the torchrun agent exited with status {status}")
            elif self._state is not State.CLOSED:
                self._state = State.STOPPED
        if launch is None:
            return
        if why == "unload":
            log.info(
                "model %s: process group idle for %g s, stopping it",
                self.spec.model_id,
                self.settings.idle_unload_s,
            )
        launch.stop(grace_s=0.0 if why == "dead" else 5.0)
        if why == "dead":
            log.warning(
                "model %s: process group output before it died: %s", self.spec.model_id, launch.last_lines()
            )

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the group (if running) and the supervisor; no rank process remains afterwards."""
        with self._cond:
            self._state = State.CLOSED
            starting = self._starting
            self._cond.notify_all()
        if starting is not None:
            starting.stop(grace_s=0.0)  # ends its start() with an error; the supervisor then exits
        # The supervisor stops the running group itself: the agent's parent-death signal is
        # tied to that thread, so the group must be down before the thread ends.
        self._thread.join(timeout_s)
        with self._cond:
            launch, self._launch = self._launch, None
        if launch is not None:
            launch.stop(grace_s=0.0)


class Aborted(Exception):
    """A request gave up waiting for the group (its job was cancelled or hit its deadline)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
