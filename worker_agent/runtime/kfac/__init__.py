"""Distributed K-FAC (SPD-KFAC, Shi et al., ICDCS 2021) for `optimizer: kfac`."""

from worker_agent.runtime.kfac.preconditioner import (
    KFACSGD,
    NAIVE,
    KFACPreconditioner,
    KFACSettings,
    StepTimes,
)

__all__ = ["NAIVE", "KFACPreconditioner", "KFACSGD", "KFACSettings", "StepTimes"]
