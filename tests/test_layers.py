"""The pure core (views, state table, plan, policies, simulator) loads no database code."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = (
    "scheduler.core.snapshot",
    "scheduler.core.states",
    "scheduler.core.plan",
    "scheduler.policies",
    "scheduler.sim.engine",
)
STORE = ("sqlalchemy", "scheduler.orm", "scheduler.db", "scheduler.models")


@pytest.mark.parametrize("module", PURE)
def test_pure_module_loads_no_store(module: str) -> None:
    # A fresh interpreter: this one has the store loaded by other tests already.
    probe = f"import sys, {module}\nprint(' '.join(m for m in {STORE!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == []


def test_probe_sees_the_store_when_loaded() -> None:
    """The check above would notice: the store itself does load SQLAlchemy."""
    probe = "import sys, scheduler.models.snapshot\nprint('sqlalchemy' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True"
