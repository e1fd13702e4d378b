"""Naming objects of the S3 artifact store: which `--artifact-store` values are taken, the key
of each artifact, and which worker references a controller accepts for a job."""

from __future__ import annotations

import pytest

from omnirt._internal.object_store import StoreLocation


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1/omnirt/prod/", "my.bucket-1", "omnirt/prod"),
    ],
)
def test_good_stores_parse(url: str, bucket: str, prefix: str) -> None:
    location = StoreLocation.parse(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert StoreLocation.parse(str(location)) == location  # what the Welcome sends compares equal


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("gs://bucket", "must be s3://BUCKET[/PREFIX]"),
        ("bucket/prefix", "must be s3://BUCKET[/PREFIX]"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://ab", "not a valid S3 bucket name"),
        ("s3://Upper", "not a valid S3 bucket name"),
        ("s3://a..b", "not a valid S3 bucket name"),
        ("s3://bucket/a//b", "empty, '.' or '..' part"),
        ("s3://bucket/a/../b", "empty, '.' or '..' part"),
    ],
)
def test_bad_stores_are_refused_with_the_reason(url: str, message: str) -> None:
    with pytest.raises(ValueError, match="--artifact-store") as caught:
        StoreLocation.parse(url)
    assert message in str(caught.value)


def test_keys_are_per_job_and_never_leave_the_job_folder() -> None:
    location = StoreLocation.parse("s3://bucket/arts")
    assert location.key("job-1", 0, "job-1-0.png") == "arts/job-1/0-job-1-0.png"
    # A file name is a name, never a path.
    assert location.key("job-1", 2, "../../x y.mp4") == "arts/job-1/2-x_y.mp4"
    assert location.key("job-1", 3, "") == "arts/job-1/3-output"
    assert StoreLocation.parse("s3://bucket").key("job-1", 0, "a.png") == "job-1/0-a.png"


@pytest.mark.parametrize(
    ("uri", "accepted"),
    [
        ("s3://bucket/arts/job-1/0-a.png", True),
        ("s3://bucket/arts/job-2/0-a.png", False),  # another job's object
        ("s3://bucket/arts/job-1/", False),  # the folder, not an object
        ("s3://bucket/arts/job-1/sub/0-a.png", False),
        ("s3://other/arts/job-1/0-a.png", False),  # another bucket
        ("s3://bucket/elsewhere/job-1/0-a.png", False),
        ("https://bucket/arts/job-1/0-a.png", False),
    ],
)
def test_a_worker_reference_must_name_an_object_of_its_job(uri: str, accepted: bool) -> None:
    key = StoreLocation.parse("s3://bucket/arts").job_key(uri, "job-1")
    assert (key == "arts/job-1/0-a.png") if accepted else key is None
