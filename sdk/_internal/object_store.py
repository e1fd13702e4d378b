"""The S3-compatible artifact store (`--artifact-store s3://bucket/prefix`), controller and worker.

boto3 does the work (credentials the usual AWS way: environment, shared config and credentials
files, AWS_PROFILE, instance roles; multipart uploads; presigned URLs); this module only names
the objects and holds the settings. boto3 is imported when a store is made, so the SDK's base
install never needs it. Every call blocks: callers on an event loop run them in a thread.

Objects of a job live under `PREFIX/JOB_ID/`, one per artifact: `PREFIX/JOB_ID/INDEX-FILE_NAME`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

S3_SCHEME = "s3://"
# S3's own bucket naming rule (3-63 characters, lower case, digits, dots and hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# S3 refuses parts under 5 MiB (all but the last): a smaller threshold still uploads in parts
# of at least this size.
MIN_PART_BYTES = 5 * 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024
_FILE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class StoreLocation:
    """A bucket and a key prefix: where one deployment's artifacts live."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> StoreLocation:
        """`s3://bucket` or `s3://bucket/prefix` (ValueError naming what is wrong)."""
        if not url.startswith(S3_SCHEME):
            raise ValueError(f"--artifact-store must be s3://BUCKET[/PREFIX], not {url!r}")
        bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
        if not bucket:
            raise ValueError(f"--artifact-store {url!r} names no bucket: s3://BUCKET[/PREFIX]")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ValueError(
                f"--artifact-store bucket {bucket!r} is not a valid S3 bucket name "
                "(3-63 characters: lower-case letters, digits, '.' and '-')"
            )
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ValueError(f"--artifact-store prefix {prefix!r} has an empty, '.' or '..' part")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{S3_SCHEME}{self.bucket}"

    def job_prefix(self, job_id: str) -> str:
        """The key prefix of one job's objects (ends with '/')."""
        return f"{self.prefix}/{job_id}/" if self.prefix else f"{job_id}/"

    def key(self, job_id: str, index: int, file_name: str) -> str:
        """The object key of artifact `index` of a job."""
        name = _FILE_NAME_UNSAFE.sub("_", file_name.rsplit("/", 1)[-1]) or "output"
        return f"{self.job_prefix(job_id)}{index}-{name}"

    def uri(self, key: str) -> str:
        """`s3://bucket/key`."""
        return f"{S3_SCHEME}{self.bucket}/{key}"

    def job_key(self, uri: str, job_id: str) -> str | None:
        """The key of `uri` when it names an object of this store under the job's prefix, else None.

        A worker must not point a job at another job's objects, or outside the store.
        """
        head = f"{S3_SCHEME}{self.bucket}/"
        if not uri.startswith(head):
            return None
        key = uri[len(head) :]
        prefix = self.job_prefix(job_id)
        rest = key[len(prefix) :]
        if not key.startswith(prefix) or not rest or "/" in rest:
            return None
        return key


class ObjectReader:
    """An object's body as chunks; `close()` gives its connection back (a reader that stops early)."""

    def __init__(self, body: Any) -> None:
        self._body = body
        self._chunks: Iterator[bytes] = body.iter_chunks(READ_CHUNK_BYTES)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        """Release the connection."""
        self._body.close()


@dataclass(frozen=True)
class StoreSettings:
    """How to reach the store: empty strings leave each to boto3's usual sources."""

    location: StoreLocation
    # e.g. http://127.0.0.1:9000 for MinIO or moto; empty = AWS_ENDPOINT_URL or AWS itself.
    endpoint: str = ""
    # empty = AWS_REGION / AWS_DEFAULT_REGION / the profile's region.
    region: str = ""
    multipart_threshold_bytes: int = DEFAULT_MULTIPART_THRESHOLD_BYTES

    @classmethod
    def of(
        cls,
        url: str,
        endpoint: str = "",
        region: str = "",
        multipart_threshold_bytes: int = DEFAULT_MULTIPART_THRESHOLD_BYTES,
    ) -> StoreSettings:
        """The settings of a daemon's `--artifact-store*` flags (ValueError naming a bad URL)."""
        return cls(StoreLocation.parse(url), endpoint, region, multipart_threshold_bytes)


def failure_reason(exc: BaseException) -> str:
    """A store failure in one bounded line (logs, report warnings, error messages)."""
    return f"{type(exc).__name__}: {exc}"[:300]


class ObjectStore:
    """Blocking operations on one store's objects (boto3's S3 client)."""

    def __init__(self, settings: StoreSettings) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.settings = settings
        self.location = settings.location
        # Path-style addressing (http://host/bucket/key): what S3-compatible servers (MinIO,
        # Ceph, moto) serve without wildcard DNS; AWS serves it too. Short timeouts and few
        # retries: a store that is down must fail an upload in seconds (the worker then sends
        # the bytes through the controller), not stall the job for minutes.
        config = Config(
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            connect_timeout=3,
            read_timeout=30,
            retries={"max_attempts": 2, "mode": "standard"},
        )
        session = boto3.session.Session()
        self._client: Any = session.client(
            "s3",
            endpoint_url=settings.endpoint or None,
            region_name=settings.region or None,
            config=config,
        )
        threshold = max(1, settings.multipart_threshold_bytes)
        self._transfer = TransferConfig(
            multipart_threshold=threshold,
            multipart_chunksize=max(threshold, MIN_PART_BYTES),
            use_threads=False,  # the caller's thread; parts go one after another
        )

    def upload(self, key: str, data: bytes, content_type: str) -> None:
        """Put one object; multipart from the threshold on (boto3's transfer manager)."""
        extra = {"ContentType": content_type} if content_type else {}
        self._client.upload_fileobj(
            io.BytesIO(data), self.location.bucket, key, ExtraArgs=extra, Config=self._transfer
        )

    def presign(self, key: str, expires_s: int) -> str:
        """A GET URL for the object that works without credentials for `expires_s` seconds."""
        url: str = self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.location.bucket, "Key": key}, ExpiresIn=expires_s
        )
        return url

    def read(self, key: str) -> ObjectReader:
        """The object's bytes in chunks (the request is made before this returns)."""
        return ObjectReader(self._client.get_object(Bucket=self.location.bucket, Key=key)["Body"])

    def delete_prefix(self, prefix: str, older_than: datetime | None = None) -> int:
        """Delete the objects under `prefix` (last modified before `older_than`, when set); how many."""
        deleted = 0
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            keys = [
                {"Key": o["Key"]}
                for o in page.get("Contents", [])
                if older_than is None or o["LastModified"] < older_than
            ]
            if keys:  # a page is at most 1000 keys: DeleteObjects' own limit
                self._client.delete_objects(
                    Bucket=self.location.bucket, Delete={"Objects": keys, "Quiet": True}
                )
                deleted += len(keys)
        return deleted

    def delete_job(self, job_id: str) -> int:
        """Delete every object of one job; how many."""
        return self.delete_prefix(self.location.job_prefix(job_id))

    def delete_expired(self, ttl_s: float, now: datetime | None = None) -> int:
        """Delete the store's objects older than `ttl_s` (their jobs expired); how many."""
        now = now or datetime.now(UTC)
        cutoff = datetime.fromtimestamp(now.timestamp() - ttl_s, UTC)
        prefix = f"{self.location.prefix}/" if self.location.prefix else ""
        return self.delete_prefix(prefix, older_than=cutoff)
