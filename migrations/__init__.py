"""Alembic migration history (one history for SQLite and PostgreSQL)."""
