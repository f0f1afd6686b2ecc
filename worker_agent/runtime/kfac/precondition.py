"""Damped Kronecker-factored solves: eigendecomposition and inverse methods, KL clipping.

Eigen method: with A = Q_A diag(d_A) Q_A^T and G = Q_G diag(d_G) Q_G^T,
    (kron(G, A) + damping I)^-1 vec(dW) = vec(Q_G [(Q_G^T dW Q_A) / (d_G d_A^T + damping)] Q_A^T),
the exact damped solve of the Kronecker block. Inverse method (Martens & Grosse 2015,
factored Tikhonov damping): (G + sqrt(damping)/pi I)^-1 dW (A + sqrt(damping) pi I)^-1 with
pi = sqrt((tr A / dim A) / (tr G / dim G)); cheaper to apply, an approximation of the solve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Method = Literal["eigen", "inverse"]


@dataclass
class Decomposition:
    """What a factor is turned into every inverse update: eigenpairs or a damped inverse.

    `values` is None for the inverse method; `matrix` is Q (eigen) or the inverse.
    """

    matrix: torch.Tensor
    values: torch.Tensor | None

    def flat(self) -> torch.Tensor:
        """One contiguous buffer for a broadcast."""
        parts = [self.matrix.reshape(-1)]
        if self.values is not None:
            parts.append(self.values)
        return torch.cat(parts)

    @staticmethod
    def elements(dim: int, method: Method) -> int:
        return dim * dim + (dim if method == "eigen" else 0)

    @staticmethod
    def from_flat(flat: torch.Tensor, dim: int, method: Method) -> Decomposition:
        matrix = flat[: dim * dim].reshape(dim, dim)
        return Decomposition(matrix, flat[dim * dim :] if method == "eigen" else None)


def tikhonov_pi(a: torch.Tensor, g: torch.Tensor) -> float:
    """Factored damping's split of the damping between A and G (Martens & Grosse 2015)."""
    a_mean = float(torch.trace(a)) / a.shape[0]
    g_mean = float(torch.trace(g)) / g.shape[0]
    if a_mean <= 0 or g_mean <= 0:
        return 1.0
    return math.sqrt(a_mean / g_mean)


def decompose(factor: torch.Tensor, method: Method, damping: float) -> Decomposition:
    """Eigenpairs of `factor` (damping is applied later), or its damped inverse.

    `damping` here is the factor's own share for the inverse method (sqrt(l)*pi or
    sqrt(l)/pi); eigendecompositions ignore it.
    """
    # Symmetrize: running averages of exchanged triangles are symmetric up to rounding.
    symmetric = (factor + factor.T) / 2
    if method == "eigen":
        values, vectors = torch.linalg.eigh(symmetric)
        # Factors are PSD; tiny negative eigenvalues are rounding.
        return Decomposition(vectors, values.clamp(min=0.0))
    eye = torch.eye(factor.shape[0], dtype=factor.dtype, device=factor.device)
    return Decomposition(torch.linalg.inv(symmetric + damping * eye), None)


def precondition(
    grad: torch.Tensor, a: Decomposition, g: Decomposition, damping: float
) -> torch.Tensor:
    """The preconditioned out x a_dim gradient matrix of one layer."""
    if a.values is not None and g.values is not None:
        rotated = g.matrix.T @ grad @ a.matrix
        rotated = rotated / (torch.outer(g.values, a.values) + damping)
        return g.matrix @ rotated @ a.matrix.T
    return g.matrix @ grad @ a.matrix


def kl_clip_scale(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], learning_rate: float, kl_clip: float
) -> float:
    """min(1, sqrt(kl_clip / sum(lr^2 * v . g))) over (preconditioned, raw) gradient pairs.

    Bounds the step's predicted change of the model's output distribution: where the
    curvature is small, the solve makes large steps, and the clip keeps them in check.
    """
    if not pairs:
        return 1.0
    total = sum(float((v * g).sum()) for v, g in pairs) * learning_rate**2
    if total <= 0:
        return 1.0
    return min(1.0, math.sqrt(kl_clip / total))
