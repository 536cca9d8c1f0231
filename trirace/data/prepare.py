"""`trirace data prepare`: a text file, a directory of text files or JSON lines, tokenised once
into memory-mappable shards plus an index (the format: data/shards.py).

The source is cut into units of about `shard_bytes` of text, each encoded by one worker
process into one shard. A text file is one document, as under `--data FILE`; a JSON-lines
file (`.jsonl`) holds one document per line, its `field`. Documents are joined by one
end-of-text id, so the shards concatenated are the ids `--data FILE` would train on.

A file larger than a unit is cut, and each piece is encoded in calls of about CHUNK_BYTES.
Cuts fall only after a newline between two printable ASCII characters: a byte-level
pre-tokenizer (ours, GPT-2's, Llama 3's) splits there anyway, so the pieces encode to the
ids of the whole file. (A tokenizer that marks the start of every text, as SentencePiece's
"▁" does, adds that mark at each cut.)

Without `--tokenizer`, a byte-level BPE of `vocab` tokens is trained as `--data FILE`
trains one (data/tokenizer.py), on the first TRAIN_BYTES of the corpus: for a corpus no
larger, that is the whole of it and so the same tokenizer.

Each shard is written atomically, then a small record of it; a run interrupted (Ctrl-C, a
kill) keeps the shards it finished, and running the same command again skips every shard
whose record matches its source pieces, tokenizer and dtype. `index.json` is written last:
until it exists, `--data DIR` refuses the directory as unfinished. A run that stops on bad
input removes what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from trirace import preflight
from trirace.data._cache import atomic_write
from trirace.data.corpus import discover
from trirace.data.shards import DTYPES, FORMAT, INDEX, PARTIAL, PROBE_BYTES, VERSION, probe_digest, shard_name
from trirace.data.tokenizer import MIN_VOCAB_SIZE, _train, eot_of
from trirace.errors import DataError, UsageError

TRAIN_BYTES = 16_000_000  # text the BPE trains on: ~4 s here at 16384 tokens
SHARD_BYTES = 16_000_000  # source text per shard (and per worker task)
CHUNK_BYTES = 1 << 20  # text per encode call: bounds the tokenizer's per-call memory
_SEARCH_BYTES = 1 << 16
_SEAM = re.compile(rb"[!-~]\n[!-~]")  # printable ASCII, newline, printable ASCII


def is_jsonl(path: Path) -> bool:
    return path.name.endswith(".jsonl")


@dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of one source file."""

    path: Path
    rel: str
    start: int
    end: int
    size: int
    mtime_ns: int
    jsonl: bool

    def describe(self) -> list:
        return [self.rel, self.start, self.end, self.size, self.mtime_ns]


def _cut(path: Path, pos: int, size: int, jsonl: bool) -> int:
    """The first cut at or after `pos`: a line start (JSON lines) or a safe seam (text), or
    the file's end where there is none."""
    with open(path, "rb") as f:
        at = pos - 1  # the byte before a cut belongs to the test
        while at < size:
            f.seek(at)
            block = f.read(_SEARCH_BYTES + 2)
            if jsonl:
                i = block.find(b"\n")
                if i >= 0:
                    return min(at + i + 1, size)
            elif m := _SEAM.search(block):
                return at + m.start() + 2
            at += _SEARCH_BYTES
    return size


def plan(files: list[Path], root: Path, shard_bytes: int) -> list[list[Piece]]:
    """The units (one shard each): consecutive pieces of about `shard_bytes` in all."""
    units: list[list[Piece]] = []
    unit: list[Piece] = []
    filled = 0
    for path in files:
        st = path.stat()
        rel = path.relative_to(root).as_posix() if path != root else path.name
        start = 0
        while start < st.st_size:
            room = shard_bytes - filled
            end = st.st_size if st.st_size - start <= room else _cut(path, start + room, st.st_size, is_jsonl(path))
            unit.append(Piece(path, rel, start, end, st.st_size, st.st_mtime_ns, is_jsonl(path)))
            filled += end - start
            if filled >= shard_bytes:
                units.append(unit)
                unit, filled = [], 0
            start = end
    if unit:
        units.append(unit)
    return units


@dataclass(frozen=True)
class Job:
    number: int
    pieces: list[Piece]
    out: Path
    tokenizer: Path
    dtype: str
    field: str
    key: str


_TOKENIZERS: dict[Path, Tokenizer] = {}


def _quiet_worker() -> None:
    # One worker per core already: the tokenizer's own threads would only compete, and a
    # forked process would warn about them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Ctrl-C reaches the whole process group: the parent alone handles it, then ends the
    # pool (SIGTERM), and a worker ending that way still removes its unfinished file.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def encode(job: Job) -> dict:
    """Write one shard and its record; return the record (its index entry)."""
    tok = _TOKENIZERS.setdefault(job.tokenizer, Tokenizer.from_file(str(job.tokenizer)))
    eot = np.array([eot_of(tok)], dtype=np.uint32)
    # The same ids without each token's offsets in the text: about twice as fast (tokenizers 0.20+).
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    parts: list[np.ndarray] = []
    documents = 0
    for piece in job.pieces:
        for starts_doc, texts in _texts(piece, job.field):
            encs = encode_batch(texts, add_special_tokens=starts_doc)
            for enc in encs:
                # Documents are joined, not merged: an end-of-text id before each but the
                # corpus's first.
                if starts_doc:
                    if documents or job.number:
                        parts.append(eot)
                    documents += 1
                parts.append(np.asarray(enc.ids, dtype=np.uint32))
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    entry = write_shard(job.out, job.number, ids, job.dtype)
    entry.update(documents=documents, key=job.key, source=[p.describe() for p in job.pieces])
    atomic_write(_record(job.out, job.number), lambda f: f.write(json.dumps(entry).encode()))
    return entry


def write_shard(out: Path, number: int, ids: np.ndarray, dtype: str) -> dict:
    """Write shard `number` of `ids` as `dtype`, atomically; return its index entry's
    description of the file (name, tokens, largest id, size, checksums)."""
    top = int(ids.max()) if len(ids) else -1
    if top > np.iinfo(DTYPES[dtype]).max:
        raise DataError(f"token id {top} does not fit {dtype}; prepare with --dtype uint32")
    data = np.ascontiguousarray(ids, dtype=DTYPES[dtype])
    raw = memoryview(data).cast("B")
    name = shard_name(number)
    atomic_write(out / name, lambda f: f.write(raw), shared=True)
    size = len(raw)
    probe = hashlib.sha256(bytes(raw[:PROBE_BYTES]) + bytes(raw[max(size - PROBE_BYTES, 0):][:PROBE_BYTES]))
    return {"file": name, "tokens": len(data), "max_id": top, "bytes": size, "sha256": hashlib.sha256(raw).hexdigest(),
            "probe_sha256": probe.hexdigest()}


def _texts(piece: Piece, field: str):
    """(whether each text starts a document, a batch of texts of about CHUNK_BYTES)."""
    if piece.jsonl:
        with open(piece.path, "rb") as f:
            f.seek(piece.start)
            data = f.read(piece.end - piece.start)
        batch: list[str] = []
        filled = 0
        for n, line in enumerate(data.split(b"\n")):
            if not line.strip():
                continue
            text = _field(line, field, piece, data, n)
            if not text.strip():
                continue  # as a blank file is no document under --data DIR
            batch.append(text)
            filled += len(text)
            if filled >= CHUNK_BYTES:
                yield True, batch
                batch, filled = [], 0
        if batch:
            yield True, batch
        return
    at = piece.start
    while at < piece.end:
        end = piece.end if piece.end - at <= CHUNK_BYTES else min(_cut(piece.path, at + CHUNK_BYTES, piece.size, False),
                                                                  piece.end)
        with open(piece.path, "rb") as f:
            f.seek(at)
            raw = f.read(end - at)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{piece.rel}: not UTF-8 at byte {at + e.start}") from None
        yield at == 0, [text]
        at = end


def _field(line: bytes, field: str, piece: Piece, data: bytes, n: int) -> str:
    where = lambda: f"{piece.rel} line {_line_number(piece, data, n)}"  # noqa: E731  (counted only on error)
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise DataError(f"{where()}: not JSON ({e})") from None
    if not isinstance(obj, dict) or field not in obj:
        raise DataError(f"{where()}: no {field!r} field (choose another with --field)")
    if not isinstance(obj[field], str):
        raise DataError(f"{where()}: {field!r} is {type(obj[field]).__name__}, not text")
    return obj[field]


def _line_number(piece: Piece, data: bytes, n: int) -> int:
    with open(piece.path, "rb") as f:
        before = f.read(piece.start).count(b"\n")
    return before + n + 1


def _record(out: Path, number: int) -> Path:
    return out / f".{shard_name(number)}.json"


def _number(entry: dict) -> int:
    return int(entry["file"].removeprefix("shard-").removesuffix(".bin"))


# The tokenizer ---------------------------------------------------------------------------

def _sample(units: list[list[Piece]], field: str) -> list[str]:
    """The first TRAIN_BYTES of the corpus's text, as documents: what the BPE trains on."""
    texts, filled = [], 0
    for unit in units:
        for piece in unit:
            for starts_doc, batch in _texts(piece, field):
                for text in batch:
                    if starts_doc or not texts:
                        texts.append(text)
                    else:  # a text file's next chunk: the same document
                        texts[-1] += text
                    filled += len(text.encode())
                if filled >= TRAIN_BYTES:
                    return texts
    return texts


def _tokenizer(out: Path, units: list[list[Piece]], field: str, vocab: int | None, hf: Path | None,
               previous: dict | None, unfinished) -> tuple[dict, bool]:
    """(the tokenizer's index entry, whether this run wrote tokenizer.json): the previous
    run's where it was made the same way, else a new one (after `unfinished()`, which marks
    the directory as changing)."""
    if hf is not None:
        data = hf.read_bytes()
        recipe = {"kind": "hf", "sha256": hashlib.sha256(data).hexdigest()}
        build = lambda: data  # noqa: E731
        source = f"hf:{hf.parent}"
    else:
        texts = _sample(units, field)
        h = hashlib.sha256()
        for t in texts:
            b = t.encode()
            h.update(len(b).to_bytes(8, "little") + b)
        recipe = {"kind": "bpe", "vocab": vocab, "sample_sha256": h.hexdigest()}
        build = lambda: _train(texts, vocab).to_str().encode()  # noqa: E731
        source = f"byte-level BPE of {vocab} tokens trained on {sum(map(len, texts))} characters of the corpus"
    path = out / "tokenizer.json"
    if previous and previous.get("recipe") == recipe and path.is_file() and \
            hashlib.sha256(path.read_bytes()).hexdigest() == previous.get("sha256"):
        return previous, False
    unfinished()
    data = build()
    atomic_write(path, lambda f: f.write(data), shared=True)
    tok = Tokenizer.from_file(str(path))
    return {"source": source, "vocab_size": tok.get_vocab_size(), "eot_id": eot_of(tok),
            "sha256": hashlib.sha256(data).hexdigest(), "recipe": recipe}, True


def _resolve_hf(spec: str) -> Path:
    p = Path(spec.removeprefix("hf:")).expanduser()
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise UsageError(f"--tokenizer {spec}: no tokenizer.json there")
    try:
        Tokenizer.from_file(str(f))
    except Exception as e:  # the tokenizers library raises its own exception type
        raise UsageError(f"--tokenizer {spec}: not a tokenizer.json ({str(e).splitlines()[0]})") from None
    return f


# The command -----------------------------------------------------------------------------

@dataclass
class Prepared:
    index: dict
    seconds: float
    source_bytes: int
    kept: int  # shards an earlier run had finished


def prepare(src: str, out: str, vocab: int | None = None, tokenizer: str | None = None, field: str | None = None,
            dtype: str | None = None, workers: int | None = None, shard_bytes: int = SHARD_BYTES,
            progress: bool = True) -> Prepared:
    t0 = time.perf_counter()
    source, target = Path(src).expanduser(), Path(out).expanduser()
    if vocab is not None and tokenizer is not None:
        raise UsageError("give --vocab (a BPE trained here) or --tokenizer (an existing one), not both")
    if vocab is not None and vocab < MIN_VOCAB_SIZE:
        raise UsageError(f"--vocab must be at least {MIN_VOCAB_SIZE} for a byte-level tokenizer, got {vocab}")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if shard_bytes < 1:
        raise UsageError("--shard-mb must be positive")
    if (source / INDEX).is_file():
        raise UsageError(f"{src} is a prepared corpus already: train on it with --data {src}")
    files = discover(src)  # as --data SRC finds them: sorted, binary and blank files left out
    root = source if source.is_dir() else source.parent
    if field is not None and not any(is_jsonl(f) for f in files):
        raise UsageError(f"--field reads JSON lines, and {src} has no .jsonl file")
    field = field or "text"
    preflight.output_dir(target, "--out")
    if source.is_dir() and (target.resolve() == source.resolve() or source.resolve() in target.resolve().parents):
        raise UsageError(f"--out {out} is inside {src}: a later run would read the shards as text")
    existing = set(target.iterdir()) if target.is_dir() else set()
    if existing and not ({target / INDEX, target / PARTIAL} & existing):
        raise UsageError(f"--out {out}: not empty, and not a prepared corpus to finish or refresh")
    hf = _resolve_hf(tokenizer) if tokenizer is not None else None
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob(".*.tmp"):  # what a killed run's atomic writes left
        stale.unlink()
    wrote: list[Path] = []
    try:
        return _prepare(source, root, target, files, vocab, hf, field, dtype, workers, shard_bytes, progress, t0, wrote)
    except UsageError:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for p in wrote:
                if p not in existing:
                    p.unlink(missing_ok=True)
        raise


def _prepare(source: Path, root: Path, out: Path, files: list[Path], vocab: int | None, hf: Path | None,
             field: str, dtype: str | None, workers: int | None, shard_bytes: int, progress: bool, t0: float,
             wrote: list[Path]) -> Prepared:
    units = plan(files, root, shard_bytes)
    old_index = json.loads((out / INDEX).read_text()) if (out / INDEX).is_file() else None
    partial = json.loads((out / PARTIAL).read_text()) if (out / PARTIAL).is_file() else None
    previous = (partial or old_index or {}).get("tokenizer")

    def unfinished(tok: dict | None = None) -> None:
        """Before anything in the directory changes: readers must see it as unfinished. A
        complete index's entries become records, so its shards can still be kept."""
        complete = (out / INDEX).is_file()
        if complete:
            for e in old_index["shards"]:
                atomic_write(_record(out, _number(e)), lambda f, e=e: f.write(json.dumps(e).encode()))
        elif not (out / PARTIAL).is_file():
            wrote.append(out / PARTIAL)  # this run's own: removed again if it stops on bad input
        atomic_write(out / PARTIAL, lambda f: f.write(json.dumps({"tokenizer": tok}).encode()))
        if complete:  # the marker first: a directory always has one of the two
            (out / INDEX).unlink()

    tok, new_tok = _tokenizer(out, units, field, vocab, hf, previous, unfinished)
    if new_tok:
        wrote.append(out / "tokenizer.json")
    auto = "uint16" if tok["vocab_size"] <= 1 << 16 else "uint32"
    if dtype == "uint16" and auto == "uint32":
        raise UsageError(f"--dtype uint16 holds ids below 65536, and the tokenizer has {tok['vocab_size']}")
    dtype = dtype or auto
    key = hashlib.sha256(json.dumps([VERSION, tok["sha256"], dtype, field]).encode()).hexdigest()[:32]

    entries = {e["file"]: e for e in (old_index or {}).get("shards", [])}
    for record in out.glob(".shard-*.json"):
        entries[json.loads(record.read_text())["file"]] = json.loads(record.read_text())
    done: dict[int, dict] = {}
    for n, unit in enumerate(units):
        e, path = entries.get(shard_name(n)), out / shard_name(n)
        if e and e["key"] == key and e["source"] == [p.describe() for p in unit] and path.is_file() \
                and path.stat().st_size == e["bytes"] and (not e["bytes"] or probe_digest(path, e["bytes"]) == e["probe_sha256"]):
            done[n] = e
    todo = [Job(n, unit, out, out / "tokenizer.json", dtype, field, key) for n, unit in enumerate(units) if n not in done]
    if todo or new_tok:
        unfinished(tok)
    total_bytes = sum(p.end - p.start for unit in units for p in unit)
    bar = tqdm(total=total_bytes, initial=sum(p.end - p.start for n in done for p in units[n]), unit="B",
               unit_scale=True, desc="prepare", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    workers = min(workers or os.cpu_count() or 1, len(todo))
    for job in todo:
        wrote += [out / shard_name(job.number), _record(out, job.number)]
    try:
        if workers <= 1:
            results = map(encode, todo)
            for e in results:
                done[_number(e)] = e
                bar.update(sum(p.end - p.start for p in units[_number(e)]))
        else:
            # spawn, not fork: a worker forked from a process with threads (torch, the
            # tokenizer's pool) can inherit a held lock and never exit. The pool is closed,
            # not terminated, once its work is done: terminate() takes the task queue's lock,
            # which an idle worker holds while it waits for its next task.
            pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_quiet_worker)
            try:
                for e in pool.imap_unordered(encode, todo):
                    done[_number(e)] = e
                    bar.update(sum(p.end - p.start for p in units[_number(e)]))
                pool.close()
            except BaseException:
                pool.terminate()
                raise
            finally:
                pool.join()
    except KeyboardInterrupt:
        bar.close()
        print(f"trirace: {len(done)} of {len(units)} shards are written; run the same command again to go on",
              file=sys.stderr)
        raise
    bar.close()

    shards = [done[n] for n in range(len(units))]
    index = {"format": FORMAT, "version": VERSION, "dtype": dtype, "tokens": sum(e["tokens"] for e in shards),
             "documents": sum(e["documents"] for e in shards), "field": field if any(p.jsonl for u in units for p in u)
             else None, "tokenizer": tok, "shards": shards}
    if index != old_index:  # a rerun with nothing to do leaves the directory as it was
        atomic_write(out / INDEX, lambda f: f.write(json.dumps(index, indent=1).encode()), shared=True)
    keep = {INDEX, "tokenizer.json"} | {e["file"] for e in shards}
    for p in out.iterdir():  # records, the unfinished marker, shards of an earlier, longer plan
        if p.name not in keep and (p.name.startswith((".shard-", "shard-")) or p.name == PARTIAL):
            p.unlink()
    return Prepared(index, time.perf_counter() - t0, total_bytes, len(units) - len(todo))
