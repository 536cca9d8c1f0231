"""Transformer models as ordered layer lists (GPT, BERT) and their presets."""

from .build import build_layer, build_layers, build_model, count_params, layer_names, layer_param_counts
from .layers import lm_loss
from .presets import PRESETS, ModelSpec

__all__ = ["PRESETS", "ModelSpec", "build_layer", "build_layers", "build_model", "count_params", "layer_names", "layer_param_counts", "lm_loss"]
