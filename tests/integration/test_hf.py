"""Hugging Face models in and out, against `transformers` itself: tiny GPT-2 and Llama
models made here with random init (nothing is downloaded) train at pp=2 x dp=2 from
hf:DIR, export with --export-hf, and load back in transformers with the same logits as
trirace's own forward of the trained weights. Then generation, and bad directories."""

import pytest
import torch
from hf_models import write_models  # noqa: E402

from trirace.cli import main  # noqa: E402
from trirace.config import make_config  # noqa: E402
from trirace.generate import load_model  # noqa: E402
from trirace.models import lm_loss  # noqa: E402
from trirace.runtime import run_local  # noqa: E402
from trirace.data.batches import batch_fn, sampler_for  # noqa: E402


transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Both families saved by transformers, each with a tokenizer.json, and a text corpus."""
    return write_models(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def trained(made):
    """3 steps at pp=2 x dp=2 from each directory, checkpointed and exported."""
    # Llama under 2bw with weight prediction: the export must hold W(3), not the prediction
    # that the last update published into the buffer.
    cfgs = {name: make_config(model=f"hf:{made / name}", data=str(made / "corpus.txt"), pp=2, dp=2,
                              schedule="1f1b" if name == "gpt2" else "2bw", steps=3, micro_batches=2,
                              delay_compensation="none" if name == "gpt2" else "predict", micro_batch_size=2,
                              seq_len=32,
                              progress=False, balance="params", checkpoint_dir=made / f"{name}-ck",
                              export_hf=made / f"{name}-out")
            for name in ("gpt2", "llama")}
    results = run_local(list(cfgs.values()), timeout_s=240)
    return {name: (cfg, rows) for (name, cfg), rows in zip(cfgs.items(), results)}


@pytest.mark.parametrize("name, cls", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")])
def test_step_0_is_the_transformers_models_loss(made, trained, name, cls):
    """Step 0 computes on the directory's weights, tokenised with its tokenizer.json."""
    cfg, rows = trained[name]
    ref = getattr(transformers, cls).from_pretrained(made / name).eval()
    batch = batch_fn(cfg, sampler_for(cfg))
    n = cfg.parallel.dp * cfg.parallel.micro_batches
    with torch.no_grad():
        want = sum(lm_loss(ref(x).logits, y).item() for x, y in (batch(0, i) for i in range(n))) / n
    assert rows[0]["loss"] == pytest.approx(want, rel=1e-5)
    assert rows[-1]["loss"] != rows[0]["loss"]


@pytest.mark.parametrize("name, cls", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")])
def test_export_loads_in_transformers_with_trirace_logits(made, trained, name, cls):
    out = made / f"{name}-out"
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not (made / f"{name}-out.partial").exists()
    exported = getattr(transformers, cls).from_pretrained(out).eval()
    ours, _, _ = load_model(made / f"{name}-ck")  # trirace's own forward on the checkpointed weights
    x = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours(x), exported(x).logits
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max())), float((a - b).abs().max())
    original = getattr(transformers, cls).from_pretrained(made / name).eval()
    with torch.no_grad():
        assert not torch.allclose(original(x).logits, b)  # it is the trained model, not the one it started from


def test_generate_is_deterministic_and_reads_both_kinds(made, trained, capsys):
    args = ["--prompt", "def add_3(a, b):", "--max-new-tokens", "8"]
    assert main(["generate", "--checkpoint", str(made / "llama-out"), *args]) == 0
    from_export = capsys.readouterr().out
    assert from_export.startswith("def add_3(a, b):") and len(from_export) > len("def add_3(a, b):")
    assert main(["generate", "--checkpoint", str(made / "llama-out"), *args]) == 0
    assert capsys.readouterr().out == from_export
    # The checkpoint has no tokenizer.json of its own: the model's source directory lends it.
    assert main(["generate", "--checkpoint", str(made / "llama-ck"), *args]) == 0
    assert capsys.readouterr().out == from_export  # the same weights, greedy: the same text
    assert main(["generate", "--checkpoint", str(made / "gpt2-out"), *args, "--top-k", "5", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("def add_3(a, b):")


def test_checkpoints_of_hf_models_resume_at_other_layouts(made, trained, tmp_path):
    """The 3-step pp=2 x dp=2 checkpoints resume at pp=1 x dp=4 (GPT-2's tied table and head
    become one parameter there) and pp=4 x dp=1 (Llama, both 2bw weight versions), continuing
    an uninterrupted 5-step run's losses."""
    import shutil

    cfgs, resumed = {}, {}
    for name, layouts in (("gpt2", [dict(pp=1, dp=4, micro_batches=1)]),
                          ("llama", [dict(pp=1, dp=4, micro_batches=1), dict(pp=4, dp=1, micro_batches=4)])):
        cfg, _ = trained[name]
        base = {k: v for k, v in cfg.flat().items() if k not in ("checkpoint_dir", "export_hf", "partition")}
        cfgs[name] = make_config(base, steps=5)
        for i, layout in enumerate(layouts):
            ck = tmp_path / f"{name}-{i}"
            shutil.copytree(made / f"{name}-ck", ck)
            resumed[name, i] = make_config(base, **layout, steps=5, checkpoint_dir=ck, resume="require")
    rows = run_local([*cfgs.values(), *resumed.values()], timeout_s=240)
    whole = {name: {r["step"]: r["loss"] for r in got} for name, got in zip(cfgs, rows)}
    for (name, i), got in zip(resumed, rows[len(cfgs):]):
        assert {r["step"] for r in got} == {3, 4}, (name, i)
        for r in got:
            assert r["loss"] == pytest.approx(whole[name][r["step"]], rel=1e-6), (name, i, r["step"])
