"""trirace: hybrid pipeline x data parallel training with multidimensional communication scheduling.

    import trirace
    cfg = trirace.make_config(model="gpt-test", data="synthetic", steps=5)
    rows = trirace.train(cfg)  # spawns pp x dp local processes, or runs its rank under torchrun
    rows = trirace.train(cfg, model=trirace.LayerModel(make_layer, count=8, vocab_size=..., max_seq_len=...))
"""

from .config import TrainConfig, make_config
from .errors import UsageError
from .errors import Diverged
from .models import PRESETS, ModelSpec, build_layers, build_model
from .models.custom import LayerModel
from .plan import Layout, Schedule, balance, build_schedule
from .runtime import Trainer, run_local, train

__version__ = "0.1.0"
__all__ = ["PRESETS", "Diverged", "LayerModel", "Layout", "ModelSpec", "Schedule", "TrainConfig", "Trainer",
           "UsageError", "balance",
           "build_layers", "build_model", "build_schedule", "make_config", "run_local", "train"]
