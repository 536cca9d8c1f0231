"""Processes racing on an empty token cache build it once."""

from __future__ import annotations

from pathlib import Path


SMALL = 150_000  # bytes of stdlib: trains in well under a second

VOCAB = 1024


def test_concurrent_first_use_builds_once(tmp_path: Path) -> None:
    """Processes racing on an empty cache all get the same ids, one entry each."""
    import subprocess
    import sys

    code = (
        "import sys, hashlib; from trirace.data import load_tokens; "
        f"s = load_tokens('stdlib', {VOCAB}, cache_dir=sys.argv[1], max_bytes={SMALL}); "
        "print(hashlib.sha256(str(s.ids.tolist()).encode()).hexdigest())"
    )
    root = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen([sys.executable, "-W", "ignore", "-c", code, str(tmp_path)],
                         cwd=root, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and outs[0]
    assert len(list(tmp_path.glob("tokenizer-*.json"))) == 1
    assert len(list(tmp_path.glob("tokens-*.pt"))) == 1
    assert not list(tmp_path.glob(".*.tmp"))
