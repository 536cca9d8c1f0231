"""A model of the user's own, for tests/integration/test_custom_model.py: the README's example
(examples/custom_block.py: its own embedding, a lower-triangular token-mixing block with a
gated MLP, a head), imported as a module the way a user's package would be, plus a factory
whose shapes do not chain and a loss of the user's. Workers find both files by the paths
LayerModel records."""

import importlib.util
import sys
from pathlib import Path

import torch.nn.functional as F
from torch import nn

_file = Path(__file__).resolve().parent.parent / "examples" / "custom_block.py"
_spec = importlib.util.spec_from_file_location("custom_block", _file)
example = sys.modules.setdefault("custom_block", importlib.util.module_from_spec(_spec))
if not hasattr(example, "make_layer"):
    _spec.loader.exec_module(example)

VOCAB, D, SEQ, COUNT = example.VOCAB, example.D, example.SEQ, example.LAYERS
make_layer = example.make_layer


def make_bad_layer(i: int) -> nn.Module:
    """Layer 2 expects width 32 where the others pass D: the shapes do not chain."""
    return nn.Linear(32, D) if i == 2 else make_layer(i)


def smoothed_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), label_smoothing=0.1)
