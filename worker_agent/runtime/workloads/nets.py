"""Small networks the built-in workloads share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """The two-convolution residual block of ResNet (He et al. 2016), CIFAR variant."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def cifar_resnet(widths: tuple[int, ...], num_classes: int, blocks: int = 1) -> nn.Sequential:
    """A CIFAR-style ResNet with `blocks` residual blocks per width (ResNet-18: widths
    64-512, 2 blocks), as a sequence of stages: the stem, one per width, the head."""
    stages: list[nn.Module] = [
        nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
    ]
    in_channels = widths[0]
    for i, width in enumerate(widths):
        stage = [BasicBlock(in_channels, width, stride=1 if i == 0 else 2)]
        stage += [BasicBlock(width, width, stride=1) for _ in range(blocks - 1)]
        stages.append(stage[0] if blocks == 1 else nn.Sequential(*stage))
        in_channels = width
    stages.append(
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes))
    )
    return nn.Sequential(*stages)


class TransformerLM(nn.Module):
    """A decoder-only (causally masked) transformer language model."""

    def __init__(
        self, vocab_size: int, seq_len: int, d_model: int, n_heads: int, n_layers: int
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(n_layers)
        )
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        # Built per call, not held as a buffer: DDP would broadcast a buffer every step.
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(x)

    def stages(self) -> list[nn.Module]:
        # Both embeddings form the first stage: they are summed before the first block.
        embeddings = nn.ModuleList([self.token_embedding, self.position_embedding])
        return [embeddings, *self.blocks, self.head]


class TransformerPart(nn.Module):
    """The blocks of a `TransformerLM` one pipeline stage runs, with the embeddings on the
    first stage and the output head on the last. It holds the model's own modules, so
    loading a part's state updates the whole model."""

    def __init__(self, model: TransformerLM, stage: int, num_stages: int) -> None:
        super().__init__()
        if not 1 <= num_stages <= len(model.blocks):
            raise ValueError(
                f"{num_stages} pipeline stages for {len(model.blocks)} transformer blocks: "
                "a stage needs at least one block"
            )
        self.first, self.last = stage == 0, stage == num_stages - 1
        bounds = [round(i * len(model.blocks) / num_stages) for i in range(num_stages + 1)]
        self.blocks = nn.ModuleList(model.blocks[bounds[stage] : bounds[stage + 1]])
        self.token_embedding = model.token_embedding if self.first else None
        self.position_embedding = model.position_embedding if self.first else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.token_embedding is not None and self.position_embedding is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.token_embedding(x) + self.position_embedding(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(x) if self.head is not None else x
