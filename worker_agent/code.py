"""Jobs' code on this node: fetched from the scheduler by digest, checked, cached, and
unpacked into each job's private directory for its workers.

The archive comes over the agent's authenticated gRPC channel (`FetchCode`), never
with a user's token. It is checked against the digest the job's spec names before it
is cached or unpacked (a tampered archive fails the launch with that reason), and
again when read from the cache. Unpacking is `jigsaw.codearchive.unpack`: regular files
and directories under relative paths only, within limits, with tarfile's data filter.

The cache is bounded (`CacheBounds`): an archive's modification time is its last
launch here; one idle past `max_idle_seconds` goes, and past `max_bytes` the least
recently launched go, never the one a launch is using. A running job needs no cached
archive (its code is unpacked in its own directory); a resumed one fetches it again.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jigsaw import codearchive
from worker_agent.isolation import WorkerIdentity

logger = logging.getLogger(__name__)

# The agent takes any archive the API may have been configured to take.
LIMITS = codearchive.Limits(max_bytes=codearchive.MAX_BYTES_CEILING)
CODE_DIR_NAME = "code"

# (job id, digest) -> the archive's bytes, as the scheduler sent them.
Fetch = Callable[[int, str], bytes]


class CodeError(RuntimeError):
    """A job's code could not be made ready here; the text says why, for its job."""


@dataclass(frozen=True)
class CacheBounds:
    """What the cache keeps (the agent's `code_cache_*` settings)."""

    max_bytes: int = 2 << 30
    max_idle_seconds: float = 7 * 24 * 3600.0


class CodeCache:
    """Archives by digest under `cache_dir`, unpacked per job for its workers."""

    def __init__(
        self,
        cache_dir: Path,
        fetch: Fetch,
        identity: WorkerIdentity | None,
        bounds: CacheBounds = CacheBounds(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cache_dir = cache_dir
        self._fetch = fetch
        self._identity = identity
        self._bounds = bounds
        self._clock = clock

    def unpacked(self, job_id: int, digest: str, job_dir: Path) -> Path:
        """`job_dir`/code holding the job's code (unpacked afresh, so a resumed job
        gets no file its last run wrote), readable by the worker user only."""
        if not codearchive.is_digest(digest):
            raise CodeError(f"code {digest!r} is not a sha256:<hex> digest")
        data = self._archive(job_id, digest)
        destination = job_dir / CODE_DIR_NAME
        job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.rmtree(destination, ignore_errors=True)
        try:
            codearchive.unpack(data, digest, destination, LIMITS)
        except codearchive.ArchiveError as exc:
            shutil.rmtree(destination, ignore_errors=True)
            raise CodeError(str(exc)) from None
        except OSError as exc:
            raise CodeError(f"could not unpack code {digest}: {exc}") from None
        self._make_private(destination)
        return destination

    def prune(self, keep: Path | None = None) -> list[Path]:
        """Delete the archives past the bounds (`keep`, the one a launch uses, stays);
        returns those deleted, least recently launched first."""
        now = self._clock()
        entries = [(path, path.stat()) for path in self._cache_dir.glob("*.tar.gz")]
        entries.sort(key=lambda entry: entry[1].st_mtime)
        total = sum(stat.st_size for _, stat in entries)
        deleted = []
        for path, stat in entries:
            idle = now - stat.st_mtime > self._bounds.max_idle_seconds
            if path == keep or not (idle or total > self._bounds.max_bytes):
                continue
            path.unlink(missing_ok=True)
            total -= stat.st_size
            deleted.append(path)
        if deleted:
            logger.info("code cache: deleted %d archive(s) past its bounds", len(deleted))
        return deleted

    def _archive(self, job_id: int, digest: str) -> bytes:
        cached = self._cache_dir / f"{digest.removeprefix('sha256:')}.tar.gz"
        data = self._cached_or_fetched(job_id, digest, cached)
        now = self._clock()
        os.utime(cached, (now, now))  # its last launch here
        self.prune(keep=cached)
        return data

    def _cached_or_fetched(self, job_id: int, digest: str, cached: Path) -> bytes:
        if cached.is_file():
            data = cached.read_bytes()
            if codearchive.digest_of(data) == digest:
                return data
            logger.warning("cached code %s is corrupt: fetching it again", digest)
        try:
            data = self._fetch(job_id, digest)
        except CodeError:
            raise
        except Exception as exc:  # noqa: BLE001 - the transport's failures end this launch only
            raise CodeError(f"could not fetch code {digest}: {exc}") from None
        actual = codearchive.digest_of(data)
        if actual != digest:
            raise CodeError(
                f"code archive {digest} failed its checksum (the scheduler sent content "
                f"hashing to {actual}): refused, nothing was unpacked"
            )
        self._cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = cached.with_suffix(".part")
        partial.write_bytes(data)
        partial.replace(cached)
        return data

    def _make_private(self, destination: Path) -> None:
        """Directories 0700, files 0600, all the worker user's when it is another."""
        for root, dirs, files in os.walk(destination):
            for name in (root, *(os.path.join(root, d) for d in dirs)):
                os.chmod(name, 0o700)
                self._give(name)
            for name in files:
                path = os.path.join(root, name)
                os.chmod(path, 0o600)
                self._give(path)

    def _give(self, path: str) -> None:
        if self._identity is not None:
            os.chown(path, self._identity.uid, self._identity.gid, follow_symlinks=False)
