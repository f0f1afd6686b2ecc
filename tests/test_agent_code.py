"""The agent's copies of jobs' code: checked against the digest before they are cached or
unpacked, cached by digest, unpacked afresh into the job's directory for the worker user.

The scheduler's side of `FetchCode` is stood in for by a function that returns bytes
(the end-to-end tests in test_code_e2e.py fetch over real gRPC)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jigsaw import codearchive
from worker_agent.code import CacheBounds, CodeCache, CodeError
from worker_agent.isolation import resolve_worker_identity


def _archive(root: Path, text: str = "WIDTH = 3\n") -> bytes:
    (root / "my_pkg").mkdir(parents=True, exist_ok=True)
    (root / "my_pkg" / "trial.py").write_text(text)
    return codearchive.pack(root, codearchive.Limits())


class _Scheduler:
    """What FetchCode answers: `served` for every request, counted."""

    def __init__(self, served: bytes) -> None:
        self.served = served
        self.requests: list[tuple[int, str]] = []

    def __call__(self, job_id: int, digest: str) -> bytes:
        self.requests.append((job_id, digest))
        return self.served


def test_code_is_fetched_once_per_digest_and_unpacked_afresh_per_launch(tmp_path: Path) -> None:
    data = _archive(tmp_path / "src")
    digest = codearchive.digest_of(data)
    scheduler = _Scheduler(data)
    cache = CodeCache(tmp_path / "cache", scheduler, identity=None)
    code = cache.unpacked(7, digest, tmp_path / "job-7")
    assert code == tmp_path / "job-7" / "code"
    assert (code / "my_pkg" / "trial.py").read_text() == "WIDTH = 3\n"
    assert stat.S_IMODE((code / "my_pkg").stat().st_mode) == 0o700
    assert stat.S_IMODE((code / "my_pkg" / "trial.py").stat().st_mode) == 0o600
    # A resume: the last run's droppings go, and the cached archive is used.
    (code / "my_pkg" / "written_by_the_trial.py").write_text("")
    cache.unpacked(7, digest, tmp_path / "job-7")
    assert sorted(p.name for p in (code / "my_pkg").iterdir()) == ["trial.py"]
    cache.unpacked(8, digest, tmp_path / "job-8")
    assert scheduler.requests == [(7, digest)]
    # A cached copy that no longer matches its digest is fetched again.
    (cached,) = (tmp_path / "cache").iterdir()
    cached.write_bytes(b"rotted")
    cache.unpacked(9, digest, tmp_path / "job-9")
    assert scheduler.requests == [(7, digest), (9, digest)]
    assert codearchive.digest_of(cached.read_bytes()) == digest


def test_an_archive_that_does_not_match_the_jobs_digest_is_refused_and_not_cached(
    tmp_path: Path,
) -> None:
    wanted = codearchive.digest_of(_archive(tmp_path / "src"))
    other = _archive(tmp_path / "other", "import os; os.system('id')\n")
    cache = CodeCache(tmp_path / "cache", _Scheduler(other), identity=None)
    with pytest.raises(CodeError, match=f"code archive {wanted} failed its checksum"):
        cache.unpacked(7, wanted, tmp_path / "job-7")
    assert not (tmp_path / "job-7" / "code").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    with pytest.raises(CodeError, match="not a sha256"):
        cache.unpacked(7, "sha256:../../etc", tmp_path / "job-7")


def test_a_failed_fetch_says_why(tmp_path: Path) -> None:
    def unreachable(job_id: int, digest: str) -> bytes:
        raise ConnectionError("the scheduler is gone")

    cache = CodeCache(tmp_path / "cache", unreachable, identity=None)
    with pytest.raises(CodeError, match="could not fetch code .*the scheduler is gone"):
        cache.unpacked(7, "sha256:" + "0" * 64, tmp_path / "job-7")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_as_root_the_code_belongs_to_the_worker_user_only(tmp_path: Path) -> None:
    identity = resolve_worker_identity("nobody")
    assert identity is not None
    data = _archive(tmp_path / "src")
    cache = CodeCache(tmp_path / "cache", _Scheduler(data), identity)
    code = cache.unpacked(7, codearchive.digest_of(data), tmp_path / "job-7")
    for path in (code, code / "my_pkg", code / "my_pkg" / "trial.py"):
        info = path.stat()
        assert (info.st_uid, info.st_gid) == (identity.uid, identity.gid), path
        assert not info.st_mode & 0o077, path  # nobody else may read it
    # The archive the agent keeps stays the agent's.
    (cached,) = (tmp_path / "cache").iterdir()
    assert cached.stat().st_uid == os.geteuid()


def test_the_cache_drops_idle_archives_and_the_least_recently_launched_past_its_size(
    tmp_path: Path,
) -> None:
    archives = {name: _archive(tmp_path / "src" / name, f"NAME = {name!r}\n") for name in "abc"}
    by_digest = {codearchive.digest_of(data): data for data in archives.values()}
    digests = {name: codearchive.digest_of(data) for name, data in archives.items()}
    fetched: list[str] = []

    def fetch(job_id: int, digest: str) -> bytes:
        fetched.append(digest)
        return by_digest[digest]

    def cached() -> set[str]:
        return {"sha256:" + p.name.removesuffix(".tar.gz") for p in (tmp_path / "c").iterdir()}

    now = [1_000_000.0]
    two = sum(sorted(len(data) for data in archives.values())[1:])  # room for any two
    bounds = CacheBounds(max_bytes=two, max_idle_seconds=3600)
    cache = CodeCache(tmp_path / "c", fetch, None, bounds, clock=lambda: now[0])

    cache.unpacked(1, digests["a"], tmp_path / "job-1")
    now[0] += 60
    cache.unpacked(2, digests["b"], tmp_path / "job-2")
    now[0] += 60
    cache.unpacked(3, digests["a"], tmp_path / "job-3")  # a launched again: b is older
    now[0] += 60
    cache.unpacked(4, digests["c"], tmp_path / "job-4")
    # Past its size the least recently launched went; the job's unpacked code stays.
    assert cached() == {digests["a"], digests["c"]}
    assert (tmp_path / "job-2" / "code" / "my_pkg" / "trial.py").is_file()
    # Idle past max_idle_seconds: gone at the next launch, all but the one launched.
    now[0] += 3600 + 1
    cache.unpacked(5, digests["b"], tmp_path / "job-5")
    assert cached() == {digests["b"]}
    # A bound below one archive keeps the archive a launch uses.
    tiny = CodeCache(tmp_path / "c", fetch, None, CacheBounds(max_bytes=0), lambda: now[0])
    assert tiny.prune() == [tmp_path / "c" / (digests["b"].removeprefix("sha256:") + ".tar.gz")]
    tiny.unpacked(6, digests["a"], tmp_path / "job-6")
    assert cached() == {digests["a"]}
    # What went was fetched again when launched again, and only that.
    assert fetched == [digests[n] for n in "abcba"]
