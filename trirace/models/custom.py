"""Your own model as an ordered list of layers.

    model = trirace.LayerModel(make_layer, count=8, vocab_size=32000, max_seq_len=256,
                               tie=("0.tok.weight", "7.out.weight"))
    rows = trirace.train(cfg, model=model)

`make_layer(i)` returns layer i, an nn.Module from one tensor to one tensor: the first takes
token ids [b, s], the ones between pass hidden states [b, s, d], the last gives logits
[b, s, vocab] (or what `loss(output, targets)` takes). Each rank calls it only for its own
layers, under a seed fixed per layer, so every rank builds the same weights without any
of them building the whole model. A list of modules works too (for models small enough to
exist whole in every process).

What the plan needs (parameter sizes, the width d, that the shapes chain) comes from
building each layer on the meta device, where no memory is allocated, and running it on
a meta batch. A layer that rejects its input is reported in one line naming it.

Local processes are new interpreters, so they find the model again by reference: the
factory's module and name (a function defined in the script you ran is found by loading
that script under another name, so keep its training call under `if __name__ ==
"__main__":`, as with torch.multiprocessing), or, for a list, a file the parent saved.
Under torchrun every rank runs your script itself and the object is used as is.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError

_LIVE: dict[str, "LayerModel"] = {}  # ref -> the object, in the process that made it


@dataclass(eq=False)
class LayerModel:
    factory: Callable[[int], nn.Module] | list[nn.Module]
    count: int | None = None
    vocab_size: int = 0
    max_seq_len: int = 0
    tie: tuple[str, str] | None = None  # ("<first layer index>.<param>", "<last layer index>.<param>")
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    _ref: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.factory, (list, tuple)):
            layers = list(self.factory)
            if not layers or not all(isinstance(m, nn.Module) for m in layers):
                raise UsageError("a layer list must be a non-empty list of nn.Module")
            if self.count not in (None, len(layers)):
                raise UsageError(f"count {self.count} but {len(layers)} layers given")
            self.count = len(layers)
        elif not callable(self.factory):
            raise UsageError("LayerModel takes a list of nn.Module or a function (index) -> nn.Module")
        if not self.count or self.count < 2:
            raise UsageError("a model needs at least 2 layers (count)")
        if self.vocab_size < 1 or self.max_seq_len < 2:
            raise UsageError("LayerModel needs vocab_size (the token ids' range) and max_seq_len")
        if self.tie is not None:
            a, b = self.tie
            if not (a.startswith("0.") and b.startswith(f"{self.count - 1}.")):
                raise UsageError(f"tie {self.tie}: only a parameter of the first layer with one of the last is "
                                 f"supported, e.g. ('0.tok.weight', '{self.count - 1}.out.weight')")

    # ------------------------------------------------------------ building

    def build(self, index: int, seed: int) -> nn.Module:
        """Layer `index`, initialised under a generator state fixed by (seed, index)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + index)
            if isinstance(self.factory, list):
                return copy.deepcopy(self.factory[index])
            layer = self.factory(index)
        if not isinstance(layer, nn.Module):
            raise UsageError(f"the layer factory returned {type(layer).__name__} for layer {index}, not an nn.Module")
        return layer

    @functools.cached_property
    def traced(self) -> tuple[int, list[list[int]], list[list[str]], str | None]:
        """(width d, per-layer parameter sizes and names, the token table's name in layer 0),
        from a meta build and forward."""
        numels, names, d, table = [], [], None, None
        b, s = 2, min(self.max_seq_len, 8)
        x = torch.zeros(b, s, dtype=torch.long, device="meta")
        for i in range(self.count):
            with torch.device("meta"):
                layer = self.build(i, 0) if not isinstance(self.factory, list) else \
                    copy.deepcopy(self.factory[i]).to("meta")
            numels.append([p.numel() for p in layer.parameters()])
            names.append([n for n, _ in layer.named_parameters()])
            if i == 0:  # the token table a sparse exchange may send by rows: the first nn.Embedding's
                table = next((f"{n}.weight" if n else "weight" for n, m in layer.named_modules()
                              if isinstance(m, nn.Embedding)), None)
            try:
                y = layer(x)
            except Exception as e:  # noqa: BLE001 - whatever the layer raises, it is the user's shape error
                raise UsageError(f"layer {i} ({type(layer).__name__}) rejects what it is given, "
                                 f"{list(x.shape)} {x.dtype}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                 ) from None
            if not isinstance(y, torch.Tensor):
                raise UsageError(f"layer {i} ({type(layer).__name__}) returns {type(y).__name__}, not one tensor")
            if i < self.count - 1:
                if y.dim() != 3 or tuple(y.shape[:2]) != (b, s) or not y.is_floating_point():
                    raise UsageError(f"layer {i} ({type(layer).__name__}) gives {list(y.shape)} {y.dtype}; "
                                     "between layers a pipeline passes float [batch, seq, d] tensors")
                if d is not None and y.shape[2] != d:
                    raise UsageError(f"layer {i} ({type(layer).__name__}) gives width {y.shape[2]}, the layers "
                                     f"before it {d}: every layer boundary must carry the same width")
                d = int(y.shape[2])
            elif self.loss is None and tuple(y.shape) != (b, s, self.vocab_size):
                raise UsageError(f"the last layer ({type(layer).__name__}) gives {list(y.shape)}, not logits "
                                 f"[batch, seq, {self.vocab_size}] (or pass loss=...)")
            x = y
        if self.tie is not None:
            for end, (i, name) in (("first", (0, self.tie[0])), ("last", (self.count - 1, self.tie[1]))):
                if name.split(".", 1)[1] not in names[i]:
                    raise UsageError(f"tie: the {end} layer has no parameter {name.split('.', 1)[1]!r}")
        if self.tie is not None:
            table = self.tie[0].split(".", 1)[1]
        return d, numels, names, table

    # ------------------------------------------------------------ finding it again in a worker

    def ref(self, scratch: Path | None = None) -> dict:
        """A JSON-able reference a worker process resolves to this model (`scratch`: where a
        layer list is saved for the workers to load)."""
        if self._ref:
            return self._ref
        ref = {"count": self.count, "vocab_size": self.vocab_size, "max_seq_len": self.max_seq_len,
               "tie": list(self.tie) if self.tie else None, "loss": _where(self.loss) if self.loss else None,
               "main": _main_file()}
        # Where the modules involved live, so a worker imports them even when they are not
        # on its path (a test directory, a script's folder).
        owners = [self.loss] if self.loss else []
        owners += [type(m) for m in self.factory] if isinstance(self.factory, list) else [self.factory]
        ref["paths"] = sorted({str(Path(f).resolve().parent) for o in owners
                               if (f := getattr(sys.modules.get(o.__module__), "__file__", None))})
        if isinstance(self.factory, list):
            if scratch is None:
                raise UsageError("a layer list is passed to local processes through a file: give scratch")
            f = Path(scratch) / "layers.pt"
            torch.save(self.factory, f)
            ref["layers_file"] = str(f)
        else:
            ref["factory"] = _where(self.factory)
        self._ref = ref
        _LIVE[key(ref)] = self
        return ref


def key(ref: dict) -> str:
    return json.dumps(ref, sort_keys=True)


def _main_file() -> str | None:
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    return str(Path(f).resolve()) if f else None


def _where(fn: Callable) -> dict:
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module is None or "<" in name:
        raise UsageError(f"{fn!r} cannot be found again in another process: define it at module level "
                         "(not a lambda or a nested function)")
    return {"module": module, "name": name}


def _user_main(path: str):
    """The script the user ran, loaded under another name (its __main__ guard stays shut)."""
    name = "trirace_user_main"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot load {path} to find the model's layers")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _resolve(where: dict, main: str | None):
    module = where["module"]
    if module == "__main__":
        if main is None:
            raise UsageError("the model's functions live in an interactive session; put them in a file")
        obj = _user_main(main)
    else:
        obj = importlib.import_module(module)
    for part in where["name"].split("."):
        obj = getattr(obj, part)
    return obj


@functools.lru_cache(maxsize=8)
def _from_key(k: str) -> LayerModel:
    ref = json.loads(k)
    sys.path.extend(p for p in ref.get("paths", []) if p not in sys.path)
    if ref.get("layers_file"):
        if ref.get("main"):  # classes pickled as __main__.X are the user's script's
            main = _user_main(ref["main"])
            saved, sys.modules["__main__"] = sys.modules["__main__"], main
            try:
                factory = torch.load(ref["layers_file"], weights_only=False)
            finally:
                sys.modules["__main__"] = saved
        else:
            factory = torch.load(ref["layers_file"], weights_only=False)
    else:
        factory = _resolve(ref["factory"], ref.get("main"))
    loss = _resolve(ref["loss"], ref.get("main")) if ref.get("loss") else None
    model = LayerModel(factory, ref["count"], ref["vocab_size"], ref["max_seq_len"],
                       tuple(ref["tie"]) if ref.get("tie") else None, loss)
    model._ref = ref
    return model


def resolve_ref(ref: dict) -> LayerModel:
    """The model a reference names: the live object in the process that made it, else
    found again (imported, or loaded from the parent's file)."""
    return _LIVE.get(key(ref)) or _from_key(key(ref))


def spec_of(ref: dict):
    """A ModelSpec standing for the custom model (arch "custom"), for the planner."""
    return spec_of_model(resolve_ref(ref))


def spec_of_model(model: LayerModel, name: str = "custom"):
    """The ModelSpec of a LayerModel in hand (arch "custom")."""
    from .presets import ModelSpec

    return ModelSpec(name, "custom", vocab_size=model.vocab_size, d_model=model.traced[0], n_layers=model.count,
                     n_heads=1, max_seq_len=model.max_seq_len, tie_embeddings=model.tie is not None, custom=model)
