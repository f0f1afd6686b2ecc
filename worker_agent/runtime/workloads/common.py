"""Trial bases the built-in workloads share: classification and language modelling on
in-memory tensors."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from worker_agent.runtime.trial import PipelineSplit, Trial
from worker_agent.runtime.workloads.nets import TransformerLM, TransformerPart

# Evaluation batches are large: no gradients are kept, and fewer batches are faster.
_EVAL_BATCH = 512


class TensorClassificationTrial(Trial):
    """Classification with train/test tensors set by the subclass's constructor."""

    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor

    def train_data(self) -> Dataset[Any]:
        return TensorDataset(self.train_inputs, self.train_targets)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs), targets)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        total_loss, correct = 0.0, 0
        for inputs, targets in zip(
            self.test_inputs.split(_EVAL_BATCH), self.test_targets.split(_EVAL_BATCH), strict=True
        ):
            inputs, targets = inputs.to(self.context.device), targets.to(self.context.device)
            logits = model(inputs)
            total_loss += F.cross_entropy(logits, targets, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == targets).sum())
        count = len(self.test_targets)
        return {"accuracy": correct / count, "loss": total_loss / count}

    def stages(self, model: nn.Module) -> list[nn.Module]:
        # Built-in classifiers are nn.Sequential of their stages.
        return list(model.children())


class LanguageModelTrial(Trial):
    """Next-token prediction over fixed-length windows of train/validation token streams.

    Subclasses set the token streams and the model's sizes.
    """

    seq_len: int
    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    train_tokens: torch.Tensor
    validation_tokens: torch.Tensor

    def train_data(self) -> Dataset[Any]:
        return TensorDataset(*self._windows(self.train_tokens))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return next_token_loss(model(inputs), targets)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        inputs, targets = self._windows(self.validation_tokens)
        total = 0.0
        for x, y in zip(inputs.split(_EVAL_BATCH), targets.split(_EVAL_BATCH), strict=True):
            logits = model(x.to(self.context.device))
            total += F.cross_entropy(
                logits.flatten(0, 1), y.to(self.context.device).flatten(), reduction="sum"
            ).item()
        loss = total / targets.numel()
        return {"loss": loss, "perplexity": math.exp(loss)}

    def build_model(self) -> nn.Module:
        return TransformerLM(
            self.vocab_size, self.seq_len, self.d_model, self.n_heads, self.n_layers
        )

    def stages(self, model: nn.Module) -> list[nn.Module]:
        if not isinstance(model, TransformerLM):
            raise TypeError(f"expected the TransformerLM of build_model(), got {type(model)}")
        return model.stages()

    def pipeline(self, model: nn.Module, stages: int) -> PipelineSplit:
        """Blocks divided evenly, embeddings on the first stage, the head on the last:
        at most one stage per block."""
        if not isinstance(model, TransformerLM):
            raise TypeError(f"expected the TransformerLM of build_model(), got {type(model)}")
        parts: list[nn.Module] = [TransformerPart(model, s, stages) for s in range(stages)]
        return PipelineSplit(parts, next_token_loss)

    def _windows(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Non-overlapping windows; each predicts its own tokens shifted by one.
        count = (len(tokens) - 1) // self.seq_len
        span = tokens[: count * self.seq_len + 1]
        return span[:-1].reshape(count, self.seq_len), span[1:].reshape(count, self.seq_len)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of every position's prediction of its next token."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
