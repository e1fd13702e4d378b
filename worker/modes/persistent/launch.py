"""`Launch`: one running torchrun agent, its ranks and the connection to rank 0.

The agent is started in its own session (`start_new_session`), with a parent-death signal
so that it never outlives the worker even when the worker is killed with SIGKILL; torchrun
starts each rank in a session of its own, so the ranks' pids (reported by rank 0 at start)
are signalled one by one as well when the group is stopped.

The parent-death signal is set by a few lines of Python that then exec torchrun
(`DEATH_SIGNAL_THEN_EXEC`), not by a `preexec_fn`: running Python in a child forked from a
worker whose grpc.aio threads are busy crashes that child with SIGSEGV now and then (gRPC's
fork handlers), while a spawn without `preexec_fn` is a vfork + exec that runs none of them.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnirt import types as t
from omnirt.worker.modes.persistent import channel
from omnirt.worker.modes.persistent.settings import GroupSettings, SettingsError
from omnirt.worker.pipelines.loader import LOAD_LOCK
from omnirt.worker.runtime import backends
from omnirt.worker.tiny import registry as tiny_models

if TYPE_CHECKING:
    from omnirt.worker.config import WorkerConfig

log = logging.getLogger("omnirt.worker.modes.persistent")

RANK_MODULE = "omnirt.worker.modes.persistent.rank"
DEFAULT_PIPELINE_CLASS = "StableDiffusionPipeline"
# `python -c DEATH_SIGNAL_THEN_EXEC WORKER_PID ARGS...` asks Linux for SIGTERM when the worker
# thread that started it goes away (a SIGKILLed worker included; the agent then stops its
# ranks), checks that the worker did not die first, and becomes `python ARGS...` (same pid).
DEATH_SIGNAL_THEN_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass  # not Linux\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(70)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


class GroupError(Exception):
    """The group cannot serve: `code` is the JobError code (UNAVAILABLE, FAILED_PRECONDITION)."""

    def __init__(self, message: str, code: str = "UNAVAILABLE") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start the group of one model."""

    model_id: str
    source: str  # a local folder or a hub id (builtin models are built by the daemon first)
    pipeline_class: str
    device: str  # cpu, cuda or npu
    dtype: str
    threads: int
    settings: GroupSettings = field(default_factory=GroupSettings)

    def launch_key(self) -> tuple[Any, ...]:
        """What needs a new group when it changes (timeouts and backoff apply to a running one)."""
        s = self.settings
        return (
            self.model_id,
            self.source,
            self.pipeline_class,
            self.device,
            self.dtype,
            self.threads,
            s.nproc_per_node,
            s.dist_backend,
            s.context_parallel,  # applied to the denoiser when it is loaded
            s.attention_backend,
        )


def launch_spec(
    spec: t.ModelSpec, backend: str, config: WorkerConfig
) -> tuple[LaunchSpec, backends.Placement]:
    """How to start `spec`'s group on `backend`; GroupError(FAILED_PRECONDITION) when it cannot be."""
    try:
        placement = backends.placement_for(backend, spec.runtime)
        settings = GroupSettings.from_runtime(spec.runtime, placement.backend, spec.pipeline_class)
    except (backends.BackendError, SettingsError) as exc:
        raise GroupError(f"model {spec.id!r}: {exc}", "FAILED_PRECONDITION") from exc
    try:  # a builtin model is built here once, so the ranks only load it
        # Under the process-wide lock of module builds: groups preloaded side by side build in
        # threads, and diffusers' lazy imports and module construction are not thread-safe
        # ("cannot import name 'WanPipeline' from 'diffusers'" when two groups built at once).
        with LOAD_LOCK:
            source = tiny_models.resolve_source(spec.source or spec.id, config.model_dir)
    except tiny_models.BuiltinModelError as exc:
        raise GroupError(f"model {spec.id!r}: {exc}", "FAILED_PRECONDITION") from exc
    launch = LaunchSpec(
        model_id=spec.id,
        source=source,
        pipeline_class=spec.pipeline_class or DEFAULT_PIPELINE_CLASS,
        device=placement.device,
        dtype=placement.dtype,
        threads=config.torch_threads,
        settings=settings,
    )
    return launch, placement


def free_port() -> int:
    """A free TCP port on the loopback (for torchrun's rendezvous store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Launch:
    """A started group: `ready` holds rank 0's start report once `start()` returned."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.folder = tempfile.mkdtemp(prefix="omnirt-pw-")  # mode 0700: only this user connects
        self.socket_path = os.path.join(self.folder, "rank0.sock")
        self.agent: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.ready: dict[str, Any] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._reader: threading.Thread | None = None

    @property
    def rank_pids(self) -> list[int]:
        return [int(pid) for pid in self.ready.get("pids", [])]

    def argv(self, port: int) -> list[str]:
        spec = self.spec
        return [
            sys.executable,
            "-c",
            DEATH_SIGNAL_THEN_EXEC,
            str(os.getpid()),
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(spec.settings.nproc_per_node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--max-restarts",
            "0",  # restarts are ours (with backoff), not torchrun's
            "--module",
            RANK_MODULE,
            "--socket",
            self.socket_path,
            "--source",
            spec.source,
            "--pipeline-class",
            spec.pipeline_class,
            "--device",
            spec.device,
            "--dtype",
            spec.dtype,
            "--dist-backend",
            spec.settings.dist_backend,
            "--threads",
            str(self._threads()),
            "--context-parallel",
            spec.settings.context_parallel,
            "--attention-backend",
            spec.settings.attention_backend,
        ]

    def _threads(self) -> int:
        if self.spec.threads > 0:
            return self.spec.threads
        # Ranks share the machine's cores rather than each taking all of them.
        return max(1, (os.cpu_count() or 1) // self.spec.settings.nproc_per_node)

    def _read_output(self) -> None:
        assert self.agent is not None and self.agent.stdout is not None
        for raw in self.agent.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.tail.append(line)
                log.info("[%s group] %s", self.spec.model_id, line)

    def last_lines(self, count: int = 8) -> str:
        """The agent's and ranks' last output lines, for error messages."""
        return " | ".join(list(self.tail)[-count:])

    def start(self) -> None:
        """Spawn torchrun and wait for rank 0's `ready` (GroupError on failure; nothing is left running)."""
        try:
            self._start()
        except BaseException:
            self.stop(grace_s=0.0)
            raise

    def _start(self) -> None:
        timeout = self.spec.settings.start_timeout_s
        deadline = time.monotonic() + timeout
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.socket_path)
            server.listen(1)
            server.settimeout(0.1)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(self._threads())}
            self.agent = subprocess.Popen(
                self.argv(free_port()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            self._reader = threading.Thread(target=self._read_output, name="omnirt-pw-output", daemon=True)
            self._reader.start()
            while self.conn is None:
                try:
                    self.conn, _ = server.accept()
                except TimeoutError:
                    status = self.agent.poll()
                    if status is not None:
                        time.sleep(0.1)  # let the reader catch the last lines
                        raise GroupError(
                            f"the process group exited with status {status} while starting: "
                            + self.last_lines()
                        ) from None
                    if time.monotonic() > deadline:
                        raise GroupError(f"the process group did not start within {timeout:g} s") from None
        finally:
            server.close()
        self.conn.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            message = channel.receive(self.conn)
        except (channel.ChannelClosed, TimeoutError, OSError) as exc:
            raise GroupError(f"rank 0 did not report ready: {exc}: {self.last_lines()}") from exc
        if message.get("type") != "ready":
            spec = self.spec
            raise GroupError(
                f"cannot load model {spec.model_id!r} from {spec.source!r}: {message.get('message')}",
                "FAILED_PRECONDITION",
            )
        self.ready = message
        self.conn.settimeout(None)

    def alive(self) -> bool:
        """True while the torchrun agent runs."""
        return self.agent is not None and self.agent.poll() is None

    def request(self, work: dict[str, Any], on_progress: Any) -> dict[str, Any]:
        """Run `work` (`{"job": ...}` or `{"jobs": [...]}`; a session op names its own `"op"`) on
        the ranks; `on_progress(step, total, previews)` returns True to stop it (`previews`: the
        step's preview images, `[(plan index, bytes, mime type), ...]`, from the pipeline program).

        Raises ChannelClosed / TimeoutError / OSError when the group dies or hangs.
        """
        assert self.conn is not None
        self.conn.settimeout(self.spec.settings.step_timeout_s)
        channel.send(self.conn, {"op": "run", **work})
        while True:
            message: dict[str, Any] = channel.receive(self.conn)
            if message.get("type") != "progress":
                return message
            previews = message.get("previews") or []
            stop = bool(on_progress(int(message["step"]), int(message["total"]), previews))
            channel.send(self.conn, {"op": "stop" if stop else "continue"})

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the group: a shutdown message, then SIGTERM, then SIGKILL to the agent and every rank."""
        if self.conn is not None and grace_s > 0:
            with contextlib.suppress(Exception):
                self.conn.settimeout(1.0)
                channel.send(self.conn, {"op": "shutdown"})
        agent = self.agent
        if agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(grace_s)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if agent.poll() is None or any(pid_alive(p) for p in self.rank_pids):
                    _signal_group(agent.pid, sig)
                    for pid in self.rank_pids:
                        _signal_group(pid, sig)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        agent.wait(5.0)
            agent.wait()
        # Ranks are children of the agent: once it is gone they are reaped by init.
        deadline = time.monotonic() + 5.0
        while any(pid_alive(p) for p in self.rank_pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        if self._reader is not None:
            self._reader.join(2.0)
        shutil.rmtree(self.folder, ignore_errors=True)
