"""Code archives: what `jigsaw submit --code DIR` ships, and what the API and the agents
refuse to store or unpack."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from jigsaw import codearchive
from jigsaw.codearchive import ArchiveError, Limits

LIMITS = Limits()


def _project(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "model.py").write_text("WIDTH = 3\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / "notes.log").write_text("local only\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"stale")
    (root / codearchive.IGNORE_FILE).write_text("# outputs\ndata/\n*.log\n")
    return root


def _names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getnames()


def _archive(add: Callable[[tarfile.TarFile], None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        add(tar)
    return buffer.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x = 1\n") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        tar.addfile(info)

    return add


def test_pack_ships_what_the_ignore_file_does_not_name_and_unpacks_to_the_same_files(
    tmp_path: Path,
) -> None:
    data = codearchive.pack(_project(tmp_path / "project"), LIMITS)
    assert _names(data) == ["pkg", "pkg/sub", "pkg/__init__.py", "pkg/sub/model.py"]
    destination = tmp_path / "out"
    codearchive.unpack(data, codearchive.digest_of(data), destination, LIMITS)
    assert (destination / "pkg" / "sub" / "model.py").read_text() == "WIDTH = 3\n"


def test_the_same_directory_packs_to_the_same_digest(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    first = codearchive.pack(project, LIMITS)
    os.utime(project / "pkg" / "__init__.py", (0, 0))  # a touched file changes nothing
    assert codearchive.pack(project, LIMITS) == first
    (project / "pkg" / "__init__.py").write_text("# changed\n")
    assert codearchive.digest_of(codearchive.pack(project, LIMITS)) != codearchive.digest_of(first)


def test_pack_refuses_links_and_directories_over_the_limits(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    (project / "secret").symlink_to("/etc/passwd")
    with pytest.raises(ArchiveError, match="symbolic link"):
        codearchive.pack(project, LIMITS)
    (project / "secret").unlink()
    (project / "pkg" / "weights.bin").write_bytes(os.urandom(4096))
    with pytest.raises(ArchiveError, match="more than the 2048 a code archive may have"):
        codearchive.pack(project, Limits(max_bytes=2048))
    with pytest.raises(ArchiveError, match="more than 2 files"):
        codearchive.pack(project, Limits(max_members=2))
    with pytest.raises(ArchiveError, match="not a directory"):
        codearchive.pack(project / "missing", LIMITS)


@pytest.mark.parametrize(
    ("add", "reason"),
    [
        (lambda tar: _file(tar, "/etc/cron.d/evil"), "leaves the archive's directory"),
        (lambda tar: _file(tar, "pkg/../../evil.py"), "leaves the archive's directory"),
        (_special("link", tarfile.SYMTYPE, "/etc/passwd"), "not a regular file or directory"),
        (_special("hard", tarfile.LNKTYPE, "pkg/a.py"), "not a regular file or directory"),
        (_special("dev", tarfile.CHRTYPE), "not a regular file or directory"),
        (_special("fifo", tarfile.FIFOTYPE), "not a regular file or directory"),
        (lambda tar: _file(tar, "json.py"), "stand in for module 'json'"),
        (lambda tar: _file(tar, "worker_agent/__init__.py"), "module 'worker_agent'"),
    ],
)
def test_check_refuses_members_outside_the_directory_and_links(
    add: Callable[[tarfile.TarFile], None], reason: str, tmp_path: Path
) -> None:
    data = _archive(add)
    with pytest.raises(ArchiveError, match=reason):
        codearchive.check(data, LIMITS)
    # The agent refuses it too, and writes nothing.
    with pytest.raises(ArchiveError, match=reason):
        codearchive.unpack(data, codearchive.digest_of(data), tmp_path / "out", LIMITS)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_modules_named_like_the_standard_library_are_fine_below_the_top() -> None:
    data = _archive(lambda tar: [_file(tar, "pkg/json.py"), _file(tar, "test/helpers.py")])
    codearchive.check(data, LIMITS)


def test_check_refuses_bombs_and_what_is_not_a_gzipped_tar() -> None:
    many = _archive(lambda tar: [_file(tar, f"m{i}.py") for i in range(5)])
    with pytest.raises(ArchiveError, match="more than 4 members"):
        codearchive.check(many, Limits(max_members=4))
    # 10 MB of zeros compress to a few kB: the unpacked size is what is bounded.
    bomb = _archive(lambda tar: _file(tar, "zeros.bin", b"\0" * 10_000_000))
    assert len(bomb) < 100_000
    with pytest.raises(ArchiveError, match="unpacks to more than 1000000 bytes"):
        codearchive.check(bomb, Limits(max_unpacked_bytes=1_000_000))
    for junk in (b"", b"not an archive", gzip.compress(b"not a tar")):
        with pytest.raises(ArchiveError, match="not a gzipped tar archive"):
            codearchive.check(junk, LIMITS)


def test_unpack_refuses_an_archive_that_does_not_match_its_digest(tmp_path: Path) -> None:
    data = codearchive.pack(_project(tmp_path / "project"), LIMITS)
    tampered = _archive(lambda tar: _file(tar, "pkg/__init__.py", b"import os\n"))
    with pytest.raises(ArchiveError, match="failed its checksum"):
        codearchive.unpack(tampered, codearchive.digest_of(data), tmp_path / "out", LIMITS)
    assert not (tmp_path / "out").exists()
