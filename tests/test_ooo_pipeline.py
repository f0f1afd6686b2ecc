"""Pipeline schedules train the transformer workload identically: zero-bubble (split
input/weight backward) reaches GPipe's and 1F1B's losses step by step, which are those of
the same model trained in one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.ooo_gang import run_on_gang
from worker_agent.runtime.schedules.pipeline import PIPELINE_SCHEDULES, BusyTime, PipelineTrainer
from worker_agent.runtime.workloads.common import next_token_loss
from worker_agent.runtime.workloads.nets import TransformerLM, TransformerPart

VOCAB, SEQ, STEPS, MICROBATCHES = 32, 8, 4, 4


def _model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(VOCAB, SEQ, d_model=16, n_heads=2, n_layers=4)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Counting sequences from random starts: learnable, so the loss falls.
    generator = torch.Generator().manual_seed(5)
    starts = [torch.randint(VOCAB, (8, 1), generator=generator) for _ in range(STEPS)]
    tokens = [(start + torch.arange(SEQ + 1)) % VOCAB for start in starts]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _losses_per_schedule() -> tuple[dict[str, list[float]], dict[str, set[str]]]:
    """Every rank trains its stage under each schedule; the last stage reports losses,
    sent to rank 0, which adds those of one process training the whole model. Also
    which compute calls rank 0's stage made (F, B = full backward or its input part,
    W = weight part)."""
    losses: dict[str, list[float]] = {}
    calls: dict[str, set[str]] = {}
    for schedule in PIPELINE_SCHEDULES:
        part = TransformerPart(_model(), dist.get_rank(), dist.get_world_size())
        busy = BusyTime()
        trainer = PipelineTrainer(
            part,
            schedule,
            MICROBATCHES,
            next_token_loss,
            _sgd(list(part.parameters())),
            torch.device("cpu"),
            busy=busy,
        )
        steps = [trainer.train(inputs, targets) for inputs, targets in _batches()]
        reported = torch.tensor([float(s) if s is not None else 0.0 for s in steps])
        dist.all_reduce(reported)  # only the last stage's are non-zero
        losses[schedule] = reported.tolist()
        calls[schedule] = {kind for kind, _, _ in busy.intervals}
    model = _model()
    optimizer = _sgd(list(model.parameters()))
    losses["one process"] = []
    for inputs, targets in _batches():
        optimizer.zero_grad()
        loss = next_token_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses["one process"].append(loss.item())
    return losses, calls


def test_zero_bubble_trains_the_transformer_to_gpipes_losses_on_four_stages() -> None:
    losses, calls = run_on_gang(4, _losses_per_schedule)
    # Only zero-bubble runs weight gradients as separate work.
    assert calls == {"gpipe": {"F", "B"}, "1f1b": {"F", "B"}, "zero-bubble": {"F", "B", "W"}}
    reference = losses["one process"]
    assert reference[-1] < reference[0] - 0.1  # it learns: equal losses are not constant ones
    for schedule in PIPELINE_SCHEDULES:
        assert losses[schedule] == [pytest.approx(x, rel=1e-4) for x in reference], schedule
