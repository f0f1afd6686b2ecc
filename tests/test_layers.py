"""The layers' rules: the pure core (views, state table, plan, policies, simulator) loads
no database code, and the import contracts of pyproject.toml hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_the_import_contracts_of_pyproject_are_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_a_broken_contract_fails_the_check(tmp_path: Path) -> None:
    """The checker sees indirect imports of external packages: the store's own do."""
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\n"
        "root_package = scheduler\n"
        "include_external_packages = True\n"
        "[importlinter:contract:store]\n"
        "name = the store without SQLAlchemy\n"
        "type = forbidden\n"
        "source_modules = scheduler.models\n"
        "forbidden_modules = sqlalchemy\n"
    )
    result = lint_imports(str(config))
    assert result.returncode != 0 and "BROKEN" in result.stdout
