"""A character-level transformer language model on real English text that ships with
CPython: the Python language reference topics of `pydoc_data` (about 0.5 MB, offline)."""

from __future__ import annotations

from functools import cache
from pydoc_data.topics import topics

import torch

from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads.common import LanguageModelTrial

_VALIDATION_FRACTION = 0.02


@cache
def _corpus() -> str:
    # Sorted keys: dict order is an implementation detail, the corpus must not be.
    return "\n".join(topics[key] for key in sorted(topics))


class TextTransformer(LanguageModelTrial):
    seq_len = 32
    d_model = 64
    n_heads = 4
    n_layers = 2

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        text = _corpus()
        alphabet = sorted(set(text))
        self.vocab_size = len(alphabet)
        index = {char: i for i, char in enumerate(alphabet)}
        tokens = torch.tensor([index[char] for char in text], dtype=torch.long)
        # The held-out tail is contiguous text the model never trains on.
        split = int(len(tokens) * (1 - _VALIDATION_FRACTION))
        self.train_tokens = tokens[:split]
        self.validation_tokens = tokens[split:]
