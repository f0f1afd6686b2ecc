"""SPB on one device (`python -m benchmarks.spb --device cuda`): a partial worker's compute
and peak memory against a full worker's, in one process, without a gang.

What one GPU can show: each configuration's partial worker (its lowest depth) and the
sum over its workers of forward plus backward, on ResNet-50- and BERT-base-sized models
(`small`: the CPU benchmark's models). The exchange (bytes, iteration time) needs one
device per worker: benchmarks/spb.py's gang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.spb.memory import forward_peak_bytes
from worker_agent.runtime.workloads.common import next_token_loss
from worker_agent.runtime.workloads.nets import TransformerLM, cifar_resnet

_GIB = 1024**3


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    stages: Callable[[nn.Module], list[nn.Module]]
    batch: Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


class _Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 down, 3x3, 1x1 up (4x), with a projection when shapes change."""

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = (
            nn.Identity()
            if stride == 1 and in_channels == out
            else nn.Sequential(
                nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-50's shape (25.6M parameters): stem, 3-4-6-3 bottlenecks, head; one stage
    per element."""
    layers: list[nn.Module] = [
        nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    ]
    channels = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            layers.append(_Bottleneck(channels, width, stride if index == 0 else 1))
            channels = 4 * width
    layers.append(
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
    )
    return nn.Sequential(*layers)


def _images(
    count: int, size: int, classes: int
) -> Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]]:
    def make(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(count, 3, size, size, generator=generator)
        return images.to(device), torch.randint(classes, (count,), generator=generator).to(device)

    return make


def _tokens(
    count: int, length: int, vocab: int
) -> Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]]:
    def make(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(vocab, (count, length + 1), generator=generator).to(device)
        return tokens[:, :-1], tokens[:, 1:]

    return make


def _classify(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _next_token(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return next_token_loss(model(inputs), targets)


def _layers(model: nn.Module) -> list[nn.Module]:
    return list(model.children())


def _transformer_stages(model: nn.Module) -> list[nn.Module]:
    assert isinstance(model, TransformerLM)
    return model.stages()


def cases(small: bool) -> list[Case]:
    if small:  # the CPU benchmark's models, at a worker's batch of its global batch over 4
        return [
            Case(
                "resnet-synthetic",
                lambda: cifar_resnet((8, 16, 32), 10),
                _layers,
                _images(32, 32, 10),
                _classify,
            ),
            Case(
                "transformer-synthetic",
                lambda: TransformerLM(256, 32, d_model=64, n_heads=4, n_layers=2),
                _transformer_stages,
                _tokens(16, 32, 256),
                _next_token,
            ),
        ]
    return [
        Case("resnet-50-sized", resnet50, _layers, _images(64, 224, 1000), _classify),
        Case(
            "bert-base-sized",
            lambda: TransformerLM(30522, 128, d_model=768, n_heads=12, n_layers=12),
            _transformer_stages,
            _tokens(32, 128, 30522),
            _next_token,
        ),
    ]


@dataclass
class _Pass:
    forward_s: float
    backward_s: float
    peak_bytes: int


def _measure(
    case: Case,
    model: nn.Module,
    batch: Any,
    cut: stage_cuts.Stages,
    depth: int,
    device: torch.device,
) -> _Pass:
    """The fastest of three forward and backward passes training the top `depth` stages,
    after a warm-up, and the step's peak memory."""
    cut.train_top(depth)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    forwards, backwards = [], []
    for index in range(4):
        model.zero_grad(set_to_none=True)
        sync()
        if cuda and index == 3:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        loss = case.loss(model, batch)
        sync()
        middle = time.perf_counter()
        loss.backward()
        sync()
        if index:  # the first pass warms up kernels and the allocator
            forwards.append(middle - start)
            backwards.append(time.perf_counter() - middle)
        del loss
    if cuda:
        # Parameters, the batch, gradients and the activations' high-water mark.
        peak = int(torch.cuda.max_memory_allocated(device))
    else:
        # glibc's heap at the end of forward, plus the parameters and their gradients.
        model.zero_grad(set_to_none=True)
        trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        every = sum(p.numel() * p.element_size() for p in model.parameters())
        peak = every + trained + forward_peak_bytes(lambda: case.loss(model, batch), device)
    return _Pass(min(forwards), min(backwards), peak)


def one_device_rows(
    configs: dict[str, SPBConfig | None],
    device: torch.device,
    workers: int,
    rounds: int,
    small: bool,
) -> list[dict[str, Any]]:
    rows = []
    for case in cases(small):
        torch.manual_seed(0)
        model = case.build().to(device)
        cut = stage_cuts.build(model, case.stages(model), None)
        full = len(cut)
        batch = case.batch(device)
        shapes = {
            name: spb.worker_depths(config, workers, full, 0) for name, config in configs.items()
        }
        needed = sorted({depth for depths in shapes.values() for depth in depths} | {full})
        passes: dict[int, _Pass] = {}
        for _ in range(rounds):  # interleaved: drift hits every depth alike
            for depth in needed:
                measured = _measure(case, model, batch, cut, depth, device)
                best = passes.get(depth)
                passes[depth] = (
                    measured
                    if best is None
                    else _Pass(
                        min(best.forward_s, measured.forward_s),
                        min(best.backward_s, measured.backward_s),
                        max(best.peak_bytes, measured.peak_bytes),
                    )
                )
        whole = passes[full]
        for name, depths in shapes.items():
            partial = passes[min(depths)]
            compute = sum(passes[d].forward_s + passes[d].backward_s for d in depths)
            rows.append(
                {
                    "workload": case.name,
                    "config": name,
                    "partial_depth": min(depths) / full,
                    "partial_backward_ratio": partial.backward_s / whole.backward_s,
                    "compute_ratio": compute / (workers * (whole.forward_s + whole.backward_s)),
                    "partial_peak_memory_ratio": partial.peak_bytes / whole.peak_bytes,
                    "full_peak_gib": whole.peak_bytes / _GIB,
                    "partial_peak_gib": partial.peak_bytes / _GIB,
                    "full_step_ms": 1000 * (whole.forward_s + whole.backward_s),
                }
            )
    return rows
