"""Where the CLI finds the API: `$JIGSAW_HOME/credentials.json`, overridable by settings.

`jigsaw up` writes the file on first start (mode 0600: it holds an admin token) as
`{"url": ..., "token": ..., "user": ...}`. `JIGSAW_API_URL` / `JIGSAW_API_TOKEN`
(settings.api.url / settings.api.token) take precedence over it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CREDENTIALS_FILE = "credentials.json"
# The cluster token of the agents `jigsaw up --local-agents` starts (`--token-file`).
AGENT_TOKEN_FILE = "agent-token"
FILE_MODE = 0o600
HOME_MODE = 0o700


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    user: str


def credentials_path(home: Path) -> Path:
    return Path(home) / CREDENTIALS_FILE


def load_credentials(home: Path) -> Credentials | None:
    """The stored credentials, or None when the file is absent or unreadable."""
    try:
        data: Any = json.loads(credentials_path(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    url, token, user = data.get("url"), data.get("token"), data.get("user", "")
    if not isinstance(url, str) or not isinstance(token, str) or not token:
        return None
    return Credentials(url=url, token=token, user=str(user))


def save_credentials(home: Path, credentials: Credentials) -> Path:
    return write_private(credentials_path(home), json.dumps(asdict(credentials), indent=2) + "\n")


def agent_token_path(home: Path) -> Path:
    return Path(home) / AGENT_TOKEN_FILE


def load_agent_token(home: Path) -> str | None:
    try:
        token = agent_token_path(home).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return token or None


def private_home(home: Path) -> Path:
    """JIGSAW_HOME, created readable by its owner only (it holds the database and the
    tokens). One that exists keeps its mode; a warning says when others may read it."""
    try:
        home.mkdir(parents=True, mode=HOME_MODE)
    except FileExistsError:
        mode = home.stat().st_mode & 0o777
        if mode & 0o066:
            logger.warning(
                "JIGSAW_HOME %s has mode %o: other users may list or read it (chmod 700)",
                home,
                mode,
            )
    else:
        home.chmod(HOME_MODE)  # mkdir applies the umask; make the mode explicit
    return home


def write_private(path: Path, text: str) -> Path:
    """Write a secret atomically, readable by its owner only (never briefly wider)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp already creates 0600; make it explicit
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to host:port."""
    if host in {"", "0.0.0.0", "::", "[::]"}:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def resolve(settings: Any, *, url: str | None = None, token: str | None = None) -> Credentials:
    """URL and token for the CLI: explicit arguments, then settings, then the file.

    The URL falls back to the address settings.api.host/port describe; the token may be
    empty (the caller reports it as missing).
    """
    stored = load_credentials(settings.home)
    resolved_url = (
        url
        or settings.api.url
        or (stored.url if stored else None)
        or local_url(settings.api.host, settings.api.port)
    )
    resolved_token = token or settings.api.token or (stored.token if stored else "")
    user = stored.user if stored and resolved_token == stored.token else ""
    return Credentials(url=resolved_url.rstrip("/"), token=resolved_token, user=user)
