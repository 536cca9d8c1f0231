import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the shared helpers (reference.py, custom_layers.py), from either tier

# Tests share one token cache; tokenizers train once per machine, not once per test.
os.environ.setdefault("TRIRACE_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "test"))


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration/ spawns processes or process groups: marked
    `integration`, so `pytest -m "not integration"` runs the pure tier (tests/unit/) alone."""
    integration = HERE / "integration"
    for item in items:
        if integration in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def quick():
    """Keyword overrides for a small, fast run on synthetic data."""
    return dict(model="gpt-test", data="synthetic", steps=10, micro_batch_size=2, seq_len=32,
                micro_batches=4, progress=False, balance="params")
