"""Schema migrations, safe when several processes start at once.

On PostgreSQL the upgrade runs under a transaction-scoped advisory lock, so two API
replicas starting together migrate once and the second finds nothing to do. On SQLite
the upgrade's BEGIN IMMEDIATE already serialises writers.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

import migrations

# Arbitrary constant naming "JigSaw schema migration" among PostgreSQL advisory locks.
MIGRATION_LOCK_ID = 0x4A16_5A01


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def _with_connection(engine: Engine, action: str, revision: str) -> None:
    config = alembic_config(engine)
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        config.attributes["connection"] = connection
        if action == "upgrade":
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    _with_connection(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    _with_connection(engine, "downgrade", revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def is_up_to_date(engine: Engine) -> bool:
    return current_revision(engine) == head_revision(engine)
