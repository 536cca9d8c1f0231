"""Your own layers (trirace.LayerModel) refused before any process starts: shapes that do not chain, lambdas, bad ties."""

import pytest

import custom_layers as cl
from trirace import LayerModel, UsageError, make_config, train


BASE = dict(data="synthetic", pp=2, dp=2, steps=6, micro_batches=4, micro_batch_size=2, seq_len=cl.SEQ,
            progress=False)


def test_layers_whose_shapes_do_not_chain_are_refused():
    bad = LayerModel(cl.make_bad_layer, count=cl.COUNT, vocab_size=cl.VOCAB, max_seq_len=cl.SEQ)
    with pytest.raises(UsageError) as e:
        train(make_config(BASE), model=bad)
    msg = str(e.value)
    assert "\n" not in msg and "layer 2 (Linear)" in msg, msg


def test_lambdas_and_bad_ties_are_refused():
    with pytest.raises(UsageError, match="module level"):
        LayerModel(lambda i: cl.make_layer(i), count=cl.COUNT, vocab_size=cl.VOCAB, max_seq_len=cl.SEQ).ref()
    with pytest.raises(UsageError, match="first layer"):
        LayerModel(cl.make_layer, count=cl.COUNT, vocab_size=cl.VOCAB, max_seq_len=cl.SEQ, tie=("1.up.weight", "5.out.weight"))
