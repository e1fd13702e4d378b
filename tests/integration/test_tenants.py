"""Tenants through a real controller (memory and Redis stores) with `--auth-keys` and a real
`null` worker with one slot: isolation, quotas with `RetryInfo`, and fair share by weight.

Clients are raw gRPC stubs sending `authorization: Bearer KEY`. Fair share is read from the
order jobs started (`Job.started_at`; one slot, so that is the dispatch order); the jobs are
`null-fair` jobs of one 50 ms step, a model of their own so the controller's run-time estimate
of it sees only such jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from omnirt.controller.edges.auth import key_digest
from omnirt.v1 import cluster_pb2, cluster_pb2_grpc, generation_pb2, generation_pb2_grpc, types_pb2
from tests.conftest import UNSERVED_SD
from tests.daemons import Controller, Worker, job_store, wait_for
from tests.rpc_status import status_details

# tenant -> (key, extra key-file lines)
TENANTS = {
    "alice": ("alice-key", ""),
    "bob": ("bob-key", ""),
    "ops": ("ops-admin-key", 'role = "admin"'),
    "carol": ("carol-key", "max_queued = 2"),
    "dave": ("dave-key", "rate_per_s = 0.05\nburst = 2"),  # a token every 20 s: none comes back here
    "heavy": ("heavy-key", "weight = 3"),
    "light": ("light-key", "weight = 1"),
}
CATALOG = (
    UNSERVED_SD
    + """
[[models]]
id = "null-fair"
family = "null"
tasks = ["text2image"]
source = "builtin:null"
pipeline_class = "NullPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 1
"""
)
FAIR = types_pb2.GenerateRequest(model="null-fair", prompt="f")
FAIR.extra.update({"sleep_ms_per_step": 50})
QUEUED = types_pb2.GenerateRequest(model="unserved-sd", prompt="waits")  # no worker serves it
FINAL = {types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED}


def auth(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TENANTS[tenant][0]}"),)


def key_file(folder: Path) -> Path:
    lines = []
    for tenant, (key, extra) in TENANTS.items():
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'sha256 = "{key_digest(key)}"', extra, ""]
    path = folder / "keys.toml"
    path.write_text("\n".join(lines))
    return path


class Api:
    """The public API of one controller, called as a tenant."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.stub = generation_pb2_grpc.GenerationServiceStub(channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(channel)

    def submit(
        self, tenant: str, request: types_pb2.GenerateRequest = QUEUED
    ) -> generation_pb2.SubmitResponse:
        return self.stub.Submit(
            generation_pb2.SubmitRequest(request=request), metadata=auth(tenant), timeout=30
        )

    def get(self, tenant: str, job_id: str) -> types_pb2.Job:
        return self.stub.GetJob(
            generation_pb2.GetJobRequest(job_id=job_id), metadata=auth(tenant), timeout=10
        ).job

    def listed(self, tenant: str) -> list[types_pb2.Job]:
        jobs: list[types_pb2.Job] = []
        token = ""
        while True:
            page = self.stub.ListJobs(
                generation_pb2.ListJobsRequest(page_size=100, page_token=token),
                metadata=auth(tenant),
                timeout=10,
            )
            jobs += page.jobs
            token = page.next_page_token
            if not token:
                return jobs

    def wait_final(self, job_ids: list[str], timeout: float = 60) -> dict[str, types_pb2.Job]:
        jobs: dict[str, types_pb2.Job] = {}

        def done() -> bool:
            for job_id in job_ids:
                if job_id not in jobs:
                    job = self.get("ops", job_id)
                    if job.state not in FINAL:
                        return False
                    jobs[job_id] = job
            return True

        wait_for(done, timeout, f"{len(job_ids)} jobs to finish")
        return jobs


@pytest.fixture(scope="module", params=["memory", "redis"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    log_dir = tmp_path_factory.mktemp(f"tenants-{request.param}")
    catalog = log_dir / "catalog.toml"
    catalog.write_text(CATALOG)
    keys = key_file(log_dir)
    with job_store(request.param, log_dir) as store:
        controller = Controller(
            log_dir, *store, "--auth-keys", str(keys), "--catalog", str(catalog), "--max-batch-size", "1"
        ).start()
        models = ("--models", "null", "--models", "null-fair", "--slots", "1")
        worker = Worker(log_dir, controller.address, "w-tenants", log_dir / "models", *models).start()
        channel = grpc.insecure_channel(controller.address)
        try:
            api = Api(channel)

            def connected() -> bool:
                listed = api.cluster.ListWorkers(
                    cluster_pb2.ListWorkersRequest(), metadata=auth("ops"), timeout=5
                )
                return any(w.id == "w-tenants" for w in listed.workers)

            wait_for(connected, 60, "the worker to connect")
            yield api
        finally:
            channel.close()
            worker.stop()
            controller.stop()


def refusal(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def seen(exc: grpc.RpcError, job_id: str) -> tuple[Any, ...]:
    """What a caller sees of a refusal, the id it asked for left out."""
    return (exc.code(), (exc.details() or "").replace(job_id, "<id>"), sorted(status_details(exc)))


def ns(timestamp: Any) -> int:
    return int(timestamp.ToNanoseconds())


# ---- isolation --------------------------------------------------------------------------------


def test_another_tenants_job_is_not_found_exactly_like_an_unknown_one(api: Api) -> None:
    done = api.stub.Generate(
        types_pb2.GenerateRequest(model="null", prompt="alice's"), metadata=auth("alice"), timeout=60
    )
    assert done.job.tenant == "alice" and done.result.report.tenant == "alice"
    waiting = api.submit("alice").job
    unknown = "job-00000000deadbeef"
    stub = api.stub

    def calls(job_id: str) -> list[Any]:
        return [
            lambda: stub.GetJob(
                generation_pb2.GetJobRequest(job_id=job_id), metadata=auth("bob"), timeout=10
            ),
            lambda: list(
                stub.WatchJob(generation_pb2.WatchJobRequest(job_id=job_id), metadata=auth("bob"), timeout=10)
            ),
            lambda: stub.CancelJob(
                generation_pb2.CancelJobRequest(job_id=job_id), metadata=auth("bob"), timeout=10
            ),
            lambda: list(
                stub.DownloadArtifact(
                    generation_pb2.DownloadArtifactRequest(job_id=job_id, index=0),
                    metadata=auth("bob"),
                    timeout=10,
                )
            ),
        ]

    for job_id in (done.job.id, waiting.id):
        for theirs, missing in zip(calls(job_id), calls(unknown), strict=True):
            got = refusal(theirs)
            assert got.code() is grpc.StatusCode.NOT_FOUND
            assert seen(got, job_id) == seen(refusal(missing), unknown)
    assert api.get("alice", waiting.id).state == types_pb2.JOB_STATE_QUEUED  # bob's cancel did nothing
    assert api.get("alice", done.job.id).result.report.tenant == "alice"
    assert api.get("ops", done.job.id).tenant == "alice"  # an admin reads every tenant's jobs


def test_list_jobs_lists_only_the_callers_jobs_and_an_admin_sees_all(api: Api) -> None:
    alice = api.submit("alice").job.id
    bob = api.submit("bob").job.id
    assert {j.tenant for j in api.listed("alice")} == {"alice"} and alice in {
        j.id for j in api.listed("alice")
    }
    assert {j.tenant for j in api.listed("bob")} == {"bob"} and alice not in {j.id for j in api.listed("bob")}
    assert {alice, bob} <= {j.id for j in api.listed("ops")}


def test_the_same_idempotency_key_from_two_tenants_makes_two_jobs(api: Api) -> None:
    keyed = types_pb2.GenerateRequest(model="unserved-sd", prompt="same", idempotency_key="nightly-7")
    a, b, again = api.submit("alice", keyed), api.submit("bob", keyed), api.submit("alice", keyed)
    assert a.job.id != b.job.id and not a.deduplicated and not b.deduplicated
    assert (a.job.tenant, b.job.tenant) == ("alice", "bob")
    assert again.deduplicated and again.job.id == a.job.id


# ---- quotas -----------------------------------------------------------------------------------


def test_max_queued_refuses_with_retry_info_and_spares_others_and_retries(api: Api) -> None:
    keyed = types_pb2.GenerateRequest(model="unserved-sd", prompt="c", idempotency_key="carol-1")
    first = api.submit("carol", keyed).job
    api.submit("carol")
    got = refusal(lambda: api.submit("carol"))
    assert got.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'carol' has 2 jobs queued or running (max_queued 2)" in (got.details() or "")
    assert status_details(got)["RetryInfo"].retry_delay.ToMilliseconds() == 1000
    assert api.submit("carol", keyed).deduplicated  # the same job asked again: no new one, no refusal
    api.submit("alice")  # another tenant is not held by carol's quota
    assert len(api.listed("carol")) == 2
    api.stub.CancelJob(generation_pb2.CancelJobRequest(job_id=first.id), metadata=auth("carol"), timeout=10)
    api.submit("carol")  # a finished job makes room


def test_rate_limit_refuses_with_the_wait_until_a_token(api: Api) -> None:
    keyed = types_pb2.GenerateRequest(model="unserved-sd", prompt="d", idempotency_key="dave-1")
    api.submit("dave", keyed)
    api.submit("dave")
    got = refusal(lambda: api.submit("dave"))
    assert got.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'dave' is over its rate limit" in (got.details() or "")
    delay_ms = status_details(got)["RetryInfo"].retry_delay.ToMilliseconds()
    assert 15_000 <= delay_ms <= 20_000  # a token every 20 s, the first two spent just now
    assert api.submit("dave", keyed).deduplicated
    api.submit("bob")


# ---- fair share -------------------------------------------------------------------------------


def test_a_flood_does_not_starve_another_tenants_job(api: Api) -> None:
    # One by one: the order of submission is then the order the store saw (on Redis, concurrent
    # calls may reach its script in another order than their created_at says).
    flood = [api.submit("alice", FAIR).job.id for _ in range(40)]
    single = api.submit("bob", FAIR).job
    jobs = api.wait_final([*flood, single.id])
    started = {job_id: ns(job.started_at) for job_id, job in jobs.items()}
    assert all(job.state == types_pb2.JOB_STATE_SUCCEEDED for job in jobs.values())
    # Of alice's jobs, those that started after bob submitted and before bob's job started:
    ahead = [j for j in flood if ns(single.created_at) < started[j] < started[single.id]]
    assert len(ahead) <= 2, f"bob's job waited for {len(ahead)} of alice's 40"
    # Alice's own jobs ran in the order she submitted them.
    assert sorted(flood, key=started.__getitem__) == flood


def test_weights_share_dispatch_between_flooding_tenants(api: Api) -> None:
    slow = types_pb2.GenerateRequest()
    slow.CopyFrom(FAIR)
    slow.model, slow.extra["sleep_ms_per_step"] = "null", 2000
    blocker = api.submit("ops", slow).job  # holds the slot while both tenants flood
    wait_for(
        lambda: api.get("ops", blocker.id).state == types_pb2.JOB_STATE_RUNNING, 30, "the blocker to run"
    )
    submitted: dict[str, list[str]] = {}
    for tenant in ("heavy", "light"):  # heavy's whole flood first: FIFO would run all of it first
        futures = [
            api.stub.Submit.future(
                generation_pb2.SubmitRequest(request=FAIR), metadata=auth(tenant), timeout=30
            )
            for _ in range(24)
        ]
        submitted[tenant] = [f.result().job.id for f in futures]
    assert api.get("ops", blocker.id).state == types_pb2.JOB_STATE_RUNNING, "the floods came too late"
    jobs = api.wait_final(submitted["heavy"] + submitted["light"])
    order = [j.tenant for j in sorted(jobs.values(), key=lambda j: ns(j.started_at))]
    # From light's first job on, both wait: weight 3 against 1 runs about 12 of heavy's in 16
    # (FIFO: none, heavy's flood was all done before light's first job).
    both = order[order.index("light") :][:16]
    assert 10 <= both.count("heavy") <= 14, order
