"""A job's code: a directory packed as a gzipped tar, named by its SHA-256 digest.

The CLI packs a directory (`pack`), the API checks an upload before storing it under
its digest (`check`), and each agent checks it again, against the digest the job names,
before unpacking it (`unpack`): a user wrote the archive, so nothing in it is trusted.
An archive holds regular files and directories only, under relative paths without
`..` (tarfile's `data` filter enforces the same again at extraction), and no top-level
module that would stand in for one of the standard library or of JigSaw.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
IGNORE_FILE = ".jigsawignore"
# Never shipped, whatever .jigsawignore says: history, bytecode and editors' droppings.
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".jigsawignore")
_DIGEST = re.compile(DIGEST_PATTERN)
# The most any deployment may let a code archive be (JIGSAW_API_MAX_CODE_BYTES's bound).
MAX_BYTES_CEILING = 1024 * 1024 * 1024
# Top-level modules an archive may not hold: first on the workers' import path, they
# would stand in for the standard library's or JigSaw's own (the runtime's) modules.
SHADOWING = frozenset(
    sys.stdlib_module_names | {"jigsaw", "worker_agent", "api", "scheduler", "migrations"}
)
# Where `check` pretends to extract, so tarfile's data filter judges every path.
_NOWHERE = "/jigsaw-code"


class ArchiveError(ValueError):
    """An archive (or a directory to pack) that is not a job's code; the text says why."""


@dataclass(frozen=True)
class Limits:
    """How large a code archive may be, packed and unpacked."""

    max_bytes: int = 16 * 1024 * 1024
    max_members: int = 10_000
    max_unpacked_bytes: int = 256 * 1024 * 1024


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    return _DIGEST.fullmatch(value) is not None


def pack(directory: Path, limits: Limits) -> bytes:
    """`directory`'s files, less those its `.jigsawignore` names, as a gzipped tar.

    Deterministic (sorted names, no times or owners), so the same code packs to the same
    digest and agents that have it cached fetch nothing.
    """
    if not directory.is_dir():
        raise ArchiveError(f"{directory} is not a directory")
    ignored = _ignore_spec(directory)
    buffer = io.BytesIO()
    members = 0
    # mtime 0: the gzip header holds no time either.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in _shipped(directory, ignored):
            members += 1
            if members > limits.max_members:
                raise ArchiveError(
                    f"{directory} has more than {limits.max_members} files: name the ones "
                    f"the job does not need in {IGNORE_FILE}"
                )
            _add(tar, directory, path)
    data = buffer.getvalue()
    if len(data) > limits.max_bytes:
        raise ArchiveError(
            f"{directory} packs to {len(data)} bytes, more than the {limits.max_bytes} a code "
            f"archive may have: name data sets and outputs in {IGNORE_FILE}"
        )
    return data


def check(data: bytes, limits: Limits) -> None:
    """Raise ArchiveError unless `data` is a gzipped tar of regular files and
    directories under safe relative paths, within `limits`."""
    if len(data) > limits.max_bytes:
        raise ArchiveError(f"archive of {len(data)} bytes: at most {limits.max_bytes}")
    unpacked = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for count, member in enumerate(tar, start=1):
                if count > limits.max_members:
                    raise ArchiveError(f"archive has more than {limits.max_members} members")
                _check_member(member)
                unpacked += member.size
                if unpacked > limits.max_unpacked_bytes:
                    raise ArchiveError(
                        f"archive unpacks to more than {limits.max_unpacked_bytes} bytes"
                    )
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise ArchiveError(f"not a gzipped tar archive: {exc}") from None


def unpack(data: bytes, digest: str, destination: Path, limits: Limits) -> None:
    """Check `data` against `digest` and `limits`, then extract it into `destination`
    (which must not exist yet)."""
    actual = digest_of(data)
    if actual != digest:
        raise ArchiveError(
            f"code archive {digest} failed its checksum (its content hashes to {actual}): refused"
        )
    check(data, limits)
    destination.mkdir(mode=0o700)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(destination, filter="data")
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ArchiveError(f"code archive {digest} could not be unpacked: {exc}") from None


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if not (member.isreg() or member.isdir()):
        raise ArchiveError(f"{name!r} is not a regular file or directory (links are refused)")
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts:
        raise ArchiveError(f"{name!r} leaves the archive's directory")
    module = _top_level_module(parts) if member.isreg() else None
    if module in SHADOWING:
        raise ArchiveError(
            f"{name!r} would stand in for module {module!r} of the standard library or of "
            "JigSaw in the job's workers: rename it (or name it in .jigsawignore)"
        )
    try:
        tarfile.data_filter(member, _NOWHERE)
    except tarfile.FilterError as exc:
        raise ArchiveError(f"{name!r}: {exc}") from None


def _top_level_module(parts: tuple[str, ...]) -> str | None:
    """The module a file defines at the archive's top (`x.py`, `x/__init__.py`)."""
    if len(parts) == 1 and parts[0].endswith(".py"):
        return parts[0].removesuffix(".py")
    if len(parts) == 2 and parts[1] == "__init__.py":
        return parts[0]
    return None


def _ignore_spec(directory: Path) -> pathspec.PathSpec:
    lines = list(ALWAYS_IGNORED)
    ignore_file = directory / IGNORE_FILE
    if ignore_file.is_file():
        lines += ignore_file.read_text(encoding="utf-8").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _shipped(directory: Path, ignored: pathspec.PathSpec) -> list[Path]:
    """Every directory and regular file to ship, parents before children."""
    shipped: list[Path] = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        relative_root = base.relative_to(directory)
        dirs[:] = sorted(
            name for name in dirs if not ignored.match_file(f"{(relative_root / name).as_posix()}/")
        )
        for name in dirs:
            shipped.append(base / name)
        for name in sorted(files):
            if not ignored.match_file((relative_root / name).as_posix()):
                shipped.append(base / name)
    return shipped


def _add(tar: tarfile.TarFile, directory: Path, path: Path) -> None:
    relative = path.relative_to(directory).as_posix()
    if path.is_symlink():
        raise ArchiveError(
            f"{path} is a symbolic link: a code archive holds regular files and directories "
            f"only (copy its target in, or name it in {IGNORE_FILE})"
        )
    info = tarfile.TarInfo(relative)
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    if not path.is_file():
        raise ArchiveError(f"{path} is not a regular file (name it in {IGNORE_FILE})")
    data = path.read_bytes()
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
