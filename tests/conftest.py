import os

import pytest

# Tests share one token cache; tokenizers train once per machine, not once per test.
os.environ.setdefault("TRIRACE_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "test"))


@pytest.fixture
def quick():
    """Keyword overrides for a small, fast run on synthetic data."""
    return dict(model="gpt-test", data="synthetic", steps=10, micro_batch_size=2, seq_len=32,
                micro_batches=4, progress=False, balance="params")
