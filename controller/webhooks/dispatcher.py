"""The webhook dispatcher: follows each job that has a webhook and delivers its events.

Engine-agnostic by design: a job's events come from `EngineClient.watch` (the one event log
both engines keep, the same one WatchJob streams), so neither engine has a webhook hook of its
own and every event a client can watch is one a webhook can get. One task per followed job
reads its events in order and delivers each wanted one before the next (a job's deliveries are
in order and never overlap); progress is coalesced (at most one per interval, the latest wins).

Delivery: a signed POST (`signing.Signer`), 2xx = delivered; anything else, a timeout or a
connection error is retried with exponential backoff and jitter. The retry window is per job:
it opens at the first failure and closes at the next success; once it has been open
`--webhook-retry-s`, the event is given up (logged, counted in
`omnirt_webhook_deliveries_total{outcome="gave_up"}`) and the job's later events get one
attempt each until one succeeds. Redirects are not followed; an address the policy refuses at
delivery time (DNS rebinding) is given up at once (`outcome="refused"`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import time
import uuid
from typing import Any

import aiohttp
from prometheus_client import Counter

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.engine_client import EngineClient, SharedRedis
from omnirt.controller.core.validation import parse_webhook_url
from omnirt.controller.webhooks import payload
from omnirt.controller.webhooks.addresses import AddressPolicy, CheckedResolver, RefusedAddress
from omnirt.controller.webhooks.follows import Follow, FollowStore, MemoryFollows, RedisFollows
from omnirt.controller.webhooks.signing import Signer, random_master, read_master
from omnirt.errors import JobNotFound, OmniRTError
from omnirt.types import JobEvent, Webhook, WebhookEvent

log = logging.getLogger("omnirt.controller.webhooks")

DEFAULT_PROGRESS_MS = 1000
CLAIM_POLL_S = 0.5  # how often a controller looks for follows nobody holds (Redis)
MAX_BACKOFF_S = 600.0
USER_AGENT = "omnirt-webhooks/1"
MASTER_KEY = "wh:master"


def _now_ms() -> int:
    return int(time.time() * 1000)


async def shared_master(redis: Any, prefix: str) -> bytes:
    """The master secret every controller of one Redis uses: the first to start makes it."""
    await redis.set(prefix + MASTER_KEY, random_master(), nx=True)
    return bytes(await redis.get(prefix + MASTER_KEY))


class WebhookDispatcher:
    """Checks webhook URLs at submission and delivers the events of the jobs that have one."""

    def __init__(
        self,
        config: ControllerConfig,
        engine: EngineClient,
        *,
        deliveries: Counter,
        job_json: payload.JobJson,
        shared: SharedRedis | None = None,
    ) -> None:
        """`deliveries` counts outcomes (`omnirt_webhook_deliveries_total`); `job_json` renders a
        payload's job; with `shared` (the Redis engine's), follows and the master secret live in
        Redis, so any controller delivers any job's webhooks."""
        self.config = config
        self.engine = engine
        self.deliveries = deliveries
        self.job_json = job_json
        self.policy = AddressPolicy.parse(config.webhook_allow)  # ValueError: a bad flag
        self.redis = shared.client if shared is not None else None
        self.prefix = shared.prefix if shared is not None else ""
        self.follows: FollowStore = RedisFollows(self.redis, self.prefix) if self.redis else MemoryFollows()
        master = read_master(config.webhook_secret_file) if config.webhook_secret_file else b""
        # Without a file: random, and on Redis the one the first controller stored (read when first needed).
        self.signer = Signer(master or (b"" if self.redis else random_master()))
        self.owner = uuid.uuid4().hex
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.wake = asyncio.Event()
        self.session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        # Artifact links in the payloads: the operator's public URL, else the gateway's address.
        self.origin = config.webhook_base_url.rstrip("/")
        if not self.origin and config.http:
            scheme = "https" if config.tls_cert else "http"
            self.origin = f"{scheme}://{config.http}"

    async def start(self) -> None:
        """Make the HTTP client; start claiming follows."""
        connector = aiohttp.TCPConnector(resolver=CheckedResolver(self.policy), limit=100)
        self.session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": USER_AGENT})
        self._loop_task = asyncio.create_task(self._claim_loop())

    async def stop(self) -> None:
        """Stop following; on Redis the follows are released for another controller to take at once
        (a controller that dies without stopping holds them until its lease runs out)."""
        held = list(self.tasks)
        tasks = [t for t in (self._loop_task, *self.tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.follows.release(self.owner, held)
        except Exception as exc:  # Redis away: the leases run out instead
            log.warning("webhooks: cannot release %d followed jobs: %s", len(held), exc)
        if self.session is not None:
            await self.session.close()

    async def _signer(self) -> Signer:
        if not self.signer.master:
            self.signer.master = await shared_master(self.redis, self.prefix)
        return self.signer

    async def secret(self, tenant: str) -> str:
        """The secret that signs `tenant`'s webhooks."""
        return (await self._signer()).secret(tenant)

    async def check(self, webhook: Webhook | None) -> None:
        """INVALID_ARGUMENT when the URL's host resolves to an address the policy refuses."""
        if webhook is not None:
            await self.policy.check(webhook.url)

    async def follow(self, job_id: str, tenant: str, webhook: Webhook) -> None:
        """Deliver the events of a job just submitted (from its first one)."""
        await self.follows.add(Follow(job_id=job_id, tenant=tenant, webhook=webhook))
        self.wake.set()

    # ---- claiming ------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        lease_ms = max(1, int(self.config.webhook_lease_s * 1000))
        renew_every_s = lease_ms / 3000  # three renewals a lease: one lost call costs nothing
        renewed = time.monotonic()
        while True:
            try:
                room = self.config.webhook_max_jobs - len(self.tasks)
                for f in await self.follows.claim(self.owner, room, lease_ms, _now_ms()):
                    if f.job_id not in self.tasks:
                        self.tasks[f.job_id] = asyncio.create_task(self._follow(f))
                if time.monotonic() - renewed >= renew_every_s:
                    renewed = time.monotonic()
                    lost = await self.follows.renew(self.owner, list(self.tasks), lease_ms, _now_ms())
                    for job_id in lost:  # another controller took it over (we were too slow)
                        task = self.tasks.pop(job_id, None)
                        if task is not None:
                            task.cancel()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: try again on the next round
                log.warning("webhooks: cannot claim or renew follows: %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLAIM_POLL_S):
                    await self.wake.wait()
            self.wake.clear()

    # ---- one job -------------------------------------------------------------------------

    async def _follow(self, f: Follow) -> None:
        try:
            await self._deliver_events(f)
            await self.follows.done(self.owner, f.job_id)
        except asyncio.CancelledError:
            raise
        except _LostLease:
            log.info("webhooks: job %s is followed by another controller now", f.job_id)
        except Exception:
            log.exception("webhooks: following job %s failed", f.job_id)
        finally:
            self.tasks.pop(f.job_id, None)

    async def _deliver_events(self, f: Follow) -> None:
        wanted = set(f.webhook.events) or set(WebhookEvent)
        interval_ms = f.webhook.progress_interval_ms or DEFAULT_PROGRESS_MS
        events: asyncio.Queue[JobEvent | Exception | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(f, events))
        held: JobEvent | None = None  # the latest progress not yet sent
        try:
            while True:
                timeout = None
                if held is not None:
                    timeout = max(0.0, (f.last_progress_ms + interval_ms - _now_ms()) / 1000)
                try:
                    async with asyncio.timeout(timeout):
                        event = await events.get()
                except TimeoutError:
                    event, held = held, None
                    assert event is not None
                if event is None:
                    return  # the job's last event is handled (or the job is gone)
                if isinstance(event, Exception):
                    raise event  # the store is away: the follow stays, claimable again after its lease
                kind = payload.webhook_event(event)
                if kind is None or kind not in wanted:
                    f.cursor = max(f.cursor, event.sequence)
                    continue
                if kind is WebhookEvent.PROGRESS:
                    if _now_ms() - f.last_progress_ms < interval_ms:
                        held = event
                        f.cursor = max(f.cursor, event.sequence)
                        continue
                    f.last_progress_ms = _now_ms()
                held = None  # a newer event: the progress held back is stale
                await self._deliver(f, kind, event)
                f.cursor = max(f.cursor, event.sequence)
                if not await self.follows.save(self.owner, f):
                    raise _LostLease
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self, f: Follow, events: asyncio.Queue[JobEvent | Exception | None]) -> None:
        try:
            async for event in self.engine.watch(f.job_id, f.cursor):
                await events.put(event)
        except JobNotFound as exc:  # the job expired before its events were all read
            log.warning("webhooks: job %s: %s", f.job_id, exc)
        except Exception as exc:
            await events.put(exc)
            return
        await events.put(None)

    async def _deliver(self, f: Follow, kind: WebhookEvent, event: JobEvent) -> None:
        """Deliver one event until it is delivered, refused or given up."""
        try:
            job = await self.engine.get(f.job_id)
        except OmniRTError:
            return
        body = payload.body(kind, event, job, self.origin, self.job_json)
        msg_id = payload.message_id(f.job_id, event.sequence)
        window_ms = self.config.webhook_retry_s * 1000
        while True:
            f.attempts += 1
            error = await self._post(f, msg_id, body)
            if not error:
                self.deliveries.labels("delivered").inc()
                f.failing_since_ms, f.attempts = 0, 0
                return
            if isinstance(error, RefusedAddress):
                self.deliveries.labels("refused").inc()
                log.warning("webhooks: %s of job %s refused: %s", msg_id, f.job_id, error)
                f.attempts = 0
                return
            now = _now_ms()
            f.failing_since_ms = f.failing_since_ms or now
            if now - f.failing_since_ms >= window_ms:
                self.deliveries.labels("gave_up").inc()
                log.warning(
                    "webhooks: gave up %s (job %s, %s) after %d attempts: %s",
                    msg_id,
                    f.job_id,
                    kind,
                    f.attempts,
                    error,
                )
                f.attempts = 0
                return
            self.deliveries.labels("retry").inc()
            if not await self.follows.save(self.owner, f):
                raise _LostLease
            delay = min(self.config.webhook_backoff_s * 2 ** (f.attempts - 1), MAX_BACKOFF_S)
            delay *= random.uniform(0.8, 1.2)  # jitter: many jobs of one dead receiver spread out
            left_s = (f.failing_since_ms + window_ms - now) / 1000
            await asyncio.sleep(max(0.0, min(delay, left_s)))

    async def _post(self, f: Follow, msg_id: str, body: bytes) -> Exception | str:
        """One attempt: "" when the receiver answered 2xx, else what went wrong."""
        assert self.session is not None
        headers = (await self._signer()).headers(f.tenant, msg_id, int(time.time()), body)
        headers["Content-Type"] = "application/json"
        try:
            # A literal address skips the resolver: checked here instead.
            host = parse_webhook_url(f.webhook.url).hostname or ""
            if not self.policy.host_allowed(host):
                with contextlib.suppress(ValueError):
                    kind = self.policy.refusal(ipaddress.ip_address(host))
                    if kind:
                        return RefusedAddress(f"{host} is a {kind} address (not in --webhook-allow)")
            timeout = aiohttp.ClientTimeout(total=self.config.webhook_timeout_s)
            async with self.session.post(
                f.webhook.url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            ) as response:
                if 200 <= response.status < 300:
                    return ""
                return f"HTTP {response.status}"
        except RefusedAddress as exc:
            return exc
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                return exc.os_error
            return f"{type(exc).__name__}: {exc}"
        except OmniRTError as exc:  # the URL no longer parses (cannot happen for a validated one)
            return RefusedAddress(str(exc))
        except Exception as exc:  # a failed attempt, whatever the client library raised: retried
            return f"{type(exc).__name__}: {exc}"


class _LostLease(Exception):
    """Another controller holds the follow now."""
