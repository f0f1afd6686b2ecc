"""`JIGSAW_HOME`: where every local process keeps its state."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    return Path(platformdirs.user_data_dir("jigsaw", appauthor=False))


class HomeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_", extra="ignore")

    home: Path = Field(
        default_factory=default_home,
        description="Directory for all local state: the embedded SQLite database, the "
        "scheduler lock file and the CLI's credentials.",
    )
