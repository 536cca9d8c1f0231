"""Token corpora read from disk by memory map: directories `trirace data prepare` writes, and
nanoGPT's flat `.bin` files.

A prepared directory holds `index.json` and shards `shard-NNNNN.bin`, each a flat array of
token ids (uint16 or uint32, native little-endian, no header: `np.memmap` reads it as is,
and so does nanoGPT's own loader). The corpus is the shards concatenated in index order:
documents are joined by one end-of-text id, as `--data FILE` joins files, so a prepared
directory of text holds the very ids that tokenising the text at start-up gives.

Nothing here reads a shard whole. Opening checks what is cheap to check and says in one
line what is wrong: every shard exists, its size is what the index says, its first and last
bytes hash to the index's probe, and the largest id the index records for it fits the
model's vocabulary. A `.bin` file has no index: its largest id is found by one scan in
blocks, kept in the cache directory under the file's path, size and modification time.
Sampling then reads only the windows drawn, so a rank touches its own samples' pages.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from bisect import bisect_right
from pathlib import Path

import numpy as np
import torch

from trirace.data._cache import atomic_write, build_lock
from trirace.data.tokenizer import EOT_ID, MASK_ID, PAD_ID
from trirace.errors import DataError

INDEX = "index.json"
FORMAT = "trirace-tokens"
VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
# The state of a prepare still running or interrupted (trirace data prepare).
PARTIAL = ".prepare.json"
PROBE_BYTES = 4096
_SCAN_TOKENS = 1 << 24  # a .bin file's scan reads this many ids at a time


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.bin"


def probe_digest(path: Path, size: int) -> str:
    """sha256 of a file's first and last PROBE_BYTES: cheap to check at every start-up, and
    a shard of another corpus or another prepare differs there in practice."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(PROBE_BYTES))
        f.seek(max(size - PROBE_BYTES, 0))
        h.update(f.read(PROBE_BYTES))
    return h.hexdigest()


def is_prepared(source: str) -> bool:
    return (Path(source).expanduser() / INDEX).is_file()


def is_bin(source: str) -> bool:
    return source.endswith(".bin") and Path(source).expanduser().is_file()


def refuse_unfinished(source: str) -> None:
    """A directory a prepare has not finished: its shards are binary, so without this it
    would pass for a directory of text holding only the prepare's state file."""
    root = Path(source).expanduser()
    if (root / PARTIAL).is_file() and not (root / INDEX).is_file():
        raise DataError(f"{source}: an unfinished trirace data prepare (no {INDEX}); run it again to finish")


class ShardStream:
    """A corpus on disk as one stream of ids: shards in order, read by memory map.

    The same interface as TokenStream (length, windows, slices), so BatchSampler draws the
    same windows from either; `lo`/`hi` bound the part of the stream this one covers."""

    def __init__(self, files: list[Path], counts: list[int], dtype: np.dtype, vocab_size: int,
                 eot_id: int = EOT_ID, lo: int = 0, hi: int | None = None):
        self.files, self.counts, self.dtype, self.vocab_size = files, counts, dtype, vocab_size
        self.eot_id, self.mask_id, self.pad_id = eot_id, MASK_ID, PAD_ID
        self.ends = np.cumsum(counts).tolist()
        self.lo, self.hi = lo, self.ends[-1] if hi is None else hi
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.hi - self.lo

    def slice(self, lo: int, hi: int) -> "ShardStream":
        return ShardStream(self.files, self.counts, self.dtype, self.vocab_size, self.eot_id,
                           self.lo + lo, self.lo + hi)

    def _map(self, k: int) -> tuple[mmap.mmap, np.ndarray]:
        if k not in self._maps:  # mapped on first use: mapping reads nothing
            fd = os.open(self.files[k], os.O_RDONLY)
            try:
                m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            m.madvise(mmap.MADV_RANDOM)  # windows are drawn at random: no read-ahead
            self._maps[k] = (m, np.frombuffer(m, dtype=self.dtype, count=self.counts[k]))
        return self._maps[k]

    def read(self, start: int, length: int) -> np.ndarray:
        """`length` ids from `start` (relative to this stream), across shard ends if need be."""
        pos, end, parts = self.lo + start, self.lo + start + length, []
        while pos < end:
            k = bisect_right(self.ends, pos)
            first = self.ends[k] - self.counts[k]
            take = min(end, self.ends[k]) - pos
            m, ids = self._map(k)
            parts.append(ids[pos - first:pos - first + take].copy())
            # The copy is ours; the pages leave this process's mapping. The kernel maps
            # the pages around each one touched, so a run drawing random windows would
            # otherwise grow its resident size toward the corpus's. They stay in the page
            # cache: drawing them again reads no disk.
            lo = (pos - first) * self.dtype.itemsize // mmap.PAGESIZE * mmap.PAGESIZE
            m.madvise(mmap.MADV_DONTNEED, lo, (pos - first + take) * self.dtype.itemsize - lo)
            pos += take
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        rows = [self.read(int(s), length) for s in starts]
        return torch.from_numpy(np.stack(rows).astype(np.int64))


def open_prepared(source: str, vocab_size: int, tokenizer: Path | None = None) -> ShardStream:
    """The prepared corpus in directory `source`, checked against its index and the model's
    vocabulary (and, for a model with its own tokenizer, that tokenizer)."""
    root = Path(source).expanduser()
    index = read_index(root)
    dtype = DTYPES[index["dtype"]]
    files, counts, top = [], [], -1
    for entry in index["shards"]:
        path = root / entry["file"]
        if not path.is_file():
            raise DataError(f"{source}: shard {entry['file']} is missing (its {INDEX} lists it); prepare again")
        size, want = path.stat().st_size, entry["tokens"] * dtype.itemsize
        if size != want:
            raise DataError(f"{source}: shard {entry['file']} holds {size} bytes but {INDEX} says {entry['tokens']} "
                            f"{index['dtype']} tokens ({want} bytes): truncated, or not this index's shard")
        if entry["tokens"] and probe_digest(path, size) != entry["probe_sha256"]:
            raise DataError(f"{source}: shard {entry['file']} does not match its {INDEX} entry (its content "
                            "differs); prepare again")
        if entry["tokens"]:
            files.append(path)
            counts.append(entry["tokens"])
            top = max(top, entry["max_id"])
    if not files:
        raise DataError(f"{source}: the prepared corpus holds no tokens")
    if top >= vocab_size:
        raise DataError(f"{source}: token id {top} is beyond the model's vocabulary of {vocab_size} (prepared with a "
                        f"{index['tokenizer']['vocab_size']}-token tokenizer); prepare it with --vocab {vocab_size} "
                        "or train a model with a larger vocabulary")
    if tokenizer is not None and hashlib.sha256(Path(tokenizer).read_bytes()).hexdigest() != \
            index["tokenizer"]["sha256"]:
        raise DataError(f"{source}: prepared with another tokenizer than the model's own ({tokenizer}); prepare it "
                        "with --tokenizer hf:DIR of the model")
    return ShardStream(files, counts, dtype, vocab_size, index["tokenizer"]["eot_id"])


def read_index(root: Path) -> dict:
    """A prepared directory's index, with the fields readers rely on checked."""
    path = root / INDEX
    try:
        index = json.loads(path.read_text())
        if index.get("format") != FORMAT:
            raise DataError(f"{path}: not a trirace token index (format {index.get('format')!r})")
        if index.get("version") != VERSION:
            raise DataError(f"{path}: token index version {index.get('version')}, this trirace reads version "
                            f"{VERSION}; prepare the corpus again")
        if index.get("dtype") not in DTYPES:
            raise DataError(f"{path}: unknown dtype {index.get('dtype')!r}")
        checks = [(index["tokenizer"], key, kind) for key, kind in (("vocab_size", int), ("eot_id", int),
                                                                     ("sha256", str))]
        checks += [(entry, key, kind) for entry in index["shards"]
                   for key, kind in (("file", str), ("tokens", int), ("max_id", int), ("probe_sha256", str))]
        for where, key, kind in checks:
            if not isinstance(where[key], kind):
                raise DataError(f"{path}: {key!r} of {where.get('file', 'the tokenizer')} is not {kind.__name__}")
        if bad := next((e["file"] for e in index["shards"] if Path(e["file"]).name != e["file"]), None):
            raise DataError(f"{path}: shard {bad!r} is not a file name in the directory")
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable ({e})") from None
    except (KeyError, TypeError) as e:
        raise DataError(f"{path}: not a trirace token index (no {e})") from None
    return index


def open_bin(source: str, dtype: str, vocab_size: int, cache_dir: Path) -> ShardStream:
    """A flat file of ids (nanoGPT's train.bin, val.bin), checked against the vocabulary."""
    path = Path(source).expanduser()
    dt = DTYPES[dtype]
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{source}: empty")
    if size % dt.itemsize:
        raise DataError(f"{source}: {size} bytes is not a whole number of {dtype} tokens (truncated, or pass the "
                        "right --data-dtype)")
    top = _max_id(path, dt, cache_dir)
    if top >= vocab_size:
        raise DataError(f"{source}: token id {top} is beyond the model's vocabulary of {vocab_size} (or the file is "
                        f"not {dtype}: pass the right --data-dtype)")
    return ShardStream([path], [size // dt.itemsize], dt, vocab_size)


def _max_id(path: Path, dt: np.dtype, cache_dir: Path) -> int:
    """The largest id in `path`: one scan in blocks (constant memory, no mapping), kept in
    the cache so that every rank and every later run reads one small file instead."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{dt.str}".encode()).hexdigest()[:32]
    entry = Path(cache_dir) / f"bin-max-{key}.json"
    if not entry.exists():
        with build_lock(entry.with_suffix(".lock")):
            if not entry.exists():
                top, buf = 0, np.empty(_SCAN_TOKENS, dtype=dt)
                with open(path, "rb") as f:
                    while n := f.readinto(memoryview(buf).cast("B")) // dt.itemsize:
                        top = max(top, int(buf[:n].max()))
                atomic_write(entry, lambda f: f.write(json.dumps({"max_id": top}).encode()))
    return json.loads(entry.read_text())["max_id"]
