"""K-FAC's mathematics against independent computations, in float64."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from curvlinops import GGNLinearOperator
from torch import nn

from worker_agent.runtime.kfac.factors import (
    FactorHooks,
    KFACLayer,
    a_factor,
    discover_layers,
    g_factor,
)
from worker_agent.runtime.kfac.precondition import decompose, precondition


@pytest.fixture(autouse=True)
def _float64() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _spd(dim: int, generator: torch.Generator) -> torch.Tensor:
    sample = torch.randn(dim, 2 * dim, generator=generator)
    return sample @ sample.T / dim


def test_eigen_method_is_the_damped_kronecker_solve() -> None:
    generator = torch.Generator().manual_seed(0)
    a, g = _spd(5, generator), _spd(3, generator)
    grad = torch.randn(3, 5, generator=generator)
    damping = 0.03
    got = precondition(grad, decompose(a, "eigen", 0.0), decompose(g, "eigen", 0.0), damping)
    # Row-major vec: vec(G X A) = kron(G, A) vec(X) for symmetric A.
    want = torch.linalg.solve(torch.kron(g, a) + damping * torch.eye(15), grad.reshape(-1))
    torch.testing.assert_close(got.reshape(-1), want, rtol=1e-10, atol=1e-12)


def test_inverse_method_is_the_factored_damping_solve() -> None:
    generator = torch.Generator().manual_seed(1)
    a, g = _spd(4, generator), _spd(2, generator)
    grad = torch.randn(2, 4, generator=generator)
    got = precondition(grad, decompose(a, "inverse", 0.1), decompose(g, "inverse", 0.2), 0.0)
    damped = torch.kron(g + 0.2 * torch.eye(2), a + 0.1 * torch.eye(4))
    torch.testing.assert_close(got.reshape(-1), torch.linalg.solve(damped, grad.reshape(-1)))


def _captured(
    model: nn.Module,
) -> tuple[list[KFACLayer], dict[tuple[str, str], torch.Tensor], FactorHooks]:
    layers = discover_layers(model)
    captured: dict[tuple[str, str], torch.Tensor] = {}

    def sink(layer: KFACLayer, kind: str, factor: torch.Tensor) -> None:
        # Several backward passes of one forward add up (the GGN's output columns).
        key = (layer.name, kind)
        captured[key] = captured[key] + factor if key in captured and kind == "G" else factor

    hooks = FactorHooks(layers, sink)
    hooks.capturing = True
    return layers, captured, hooks


def test_batch_of_one_kronecker_is_the_gradient_outer_product() -> None:
    generator = torch.Generator().manual_seed(2)
    for layer in (nn.Linear(4, 3), nn.Conv2d(2, 3, 3, padding=0)):
        shape = (1, 4) if isinstance(layer, nn.Linear) else (1, 2, 3, 3)  # conv: one position
        inputs = torch.randn(*shape, generator=generator)
        layers, captured, _ = _captured(layer)
        layer(inputs).pow(3).sum().backward()
        (kfac_layer,) = layers
        flat = kfac_layer.gradient_matrix().reshape(-1)
        kron = torch.kron(captured[(kfac_layer.name, "G")], captured[(kfac_layer.name, "A")])
        torch.testing.assert_close(kron, torch.outer(flat, flat), rtol=1e-12, atol=1e-12)


def test_conv_factors_average_over_positions_and_sum_over_sample() -> None:
    # Scaling check of the Conv2d convention against per-position rows built by hand.
    generator = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(2, 3, 2, bias=True)
    inputs = torch.randn(4, 2, 3, 3, generator=generator)
    grad_output = torch.randn(4, 3, 2, 2, generator=generator)
    rows = [
        torch.cat([inputs[n, :, i : i + 2, j : j + 2].reshape(-1), torch.ones(1)])
        for n in range(4)
        for i in range(2)
        for j in range(2)
    ]
    a = sum(torch.outer(r, r) for r in rows) / len(rows)
    g = 4 * sum(
        torch.outer(grad_output[n, :, i, j], grad_output[n, :, i, j])
        for n in range(4)
        for i in range(2)
        for j in range(2)
    )
    torch.testing.assert_close(a_factor(conv, inputs), a)
    torch.testing.assert_close(g_factor(conv, grad_output), g)


def test_deep_linear_network_kfac_blocks_are_the_exact_ggn_blocks() -> None:
    """For a deep linear network under MSE, K-FAC with the loss Hessian's square root
    backpropagated (instead of sampled gradients) is exact per layer: the oracle is
    curvlinops' exact GGN (an independent implementation)."""
    generator = torch.Generator().manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5, bias=False), nn.Linear(5, 2))
    batch, outputs = 6, 2
    inputs = torch.randn(batch, 3, generator=generator)
    targets = torch.randn(batch, outputs, generator=generator)
    layers, captured, hooks = _captured(model)
    output = model(inputs)
    # MSELoss (mean over batch * outputs): per-sample Hessian 2 / outputs * I; a mean-reduced
    # loss scales what reaches the output by 1 / batch.
    root = (2 / outputs) ** 0.5 / batch
    for column in range(outputs):
        seed = torch.zeros_like(output)
        seed[:, column] = root
        output.backward(seed, retain_graph=True)
    hooks.capturing = False  # the oracle runs the model too
    exact = GGNLinearOperator(
        model,
        nn.MSELoss(),
        list(model.parameters()),
        [(inputs, targets)],
        check_deterministic=False,
    )
    ggn = exact @ torch.eye(exact.shape[0])
    offset = 0
    for layer in layers:
        weight_size = layer.module.weight.numel()
        size = weight_size + (layer.module.bias.numel() if layer.has_bias else 0)
        block = ggn[offset : offset + size, offset : offset + size]
        offset += size
        kron = torch.kron(captured[(layer.name, "G")], captured[(layer.name, "A")])
        # Our vec is row-major over [W | b]: each output row's weights, then its bias.
        out, inp = layer.module.weight.shape
        order = [o * inp + i for o in range(out) for i in range(inp)]
        if layer.has_bias:
            order = [
                index
                for o in range(out)
                for index in [*range(o * inp, (o + 1) * inp), weight_size + o]
            ]
        permuted = block[order][:, order]
        torch.testing.assert_close(kron, permuted, rtol=1e-10, atol=1e-12)


def test_layers_without_kronecker_factors_are_skipped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 1))
    with caplog.at_level("INFO", logger="worker_agent.runtime.kfac.factors"):
        layers = discover_layers(model)
    assert [layer.name for layer in layers] == ["0", "3"]
    assert "K-FAC skips 1 (BatchNorm2d)" in caplog.text


def test_the_attention_output_projection_its_module_never_calls_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True))
    with caplog.at_level("INFO", logger="worker_agent.runtime.kfac.factors"):
        layers = discover_layers(model)
    assert [layer.name for layer in layers] == ["0.linear1", "0.linear2"]
    assert "K-FAC skips 0.self_attn.out_proj" in caplog.text
