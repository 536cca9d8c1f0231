"""What the reporting rank shows and writes: the progress bar, the per-step metrics file
(JSON lines), TensorBoard scalars, and the closing summary line. One rank writes them: the
reporter (the last stage's first replica), the one rank that holds every step's metrics
after their all-reduce."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from ..config import TrainConfig


class Reporter:
    """Progress bar, per-step metrics file and the closing summary, on one rank."""

    def __init__(self, cfg: TrainConfig, sizes: list[int]):
        self.cfg, self.sizes, self.rows = cfg, sizes, []
        self.val: float | None = None  # the latest validation loss, shown until the next
        self.bar = tqdm(total=cfg.steps, desc=f"train {cfg.model.name} {cfg.parallel.schedule} pp={cfg.parallel.pp} dp={cfg.parallel.dp}",
                        unit="step", disable=not cfg.observe.progress, file=sys.stderr, dynamic_ncols=True)
        self.out = None
        if cfg.observe.metrics_out:
            Path(cfg.observe.metrics_out).parent.mkdir(parents=True, exist_ok=True)
            self.out = open(cfg.observe.metrics_out, "w")
        self.board = None
        if cfg.observe.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra, checked by config

            self.board = SummaryWriter(str(cfg.observe.tensorboard))

    def start(self, t: float) -> None:
        self.last = t

    def step(self, step: int, end: float, values: dict) -> None:
        dt, self.last = end - self.last, end
        row = {"step": step, "loss": values["loss"], "step_time_s": dt, "tokens_per_s": self.cfg.tokens_per_step / dt,
               "schedule": self.cfg.parallel.schedule, "pp": self.cfg.parallel.pp, "dp": self.cfg.parallel.dp, **values}
        self.rows.append(row)
        if self.out:
            self.out.write(json.dumps(row) + "\n")
            self.out.flush()
        if self.board:
            self._scalars(row)
        shown = {"loss": f"{row['loss']:.3f}"}
        if row.get("val_loss") is not None:
            self.val = row["val_loss"]
        if self.val is not None:
            shown["val"] = f"{self.val:.3f}"
        if "lr" in row:  # (the torch peer's rows have no update-rule figures)
            shown["lr"] = f"{row['lr']:.2g}"
        shown["tok_s"] = f"{row['tokens_per_s']:.0f}"
        self.bar.set_postfix(shown)
        self.bar.update()

    # TensorBoard tag -> the metrics row's key (the same figures as --metrics-out)
    SCALARS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
               "speed/tokens_per_s": "tokens_per_s", "speed/step_time_s": "step_time_s",
               "speed/compute_s": "compute_s", "comm/exposed_p2p_s": "exposed_p2p_s",
               "comm/exposed_allreduce_s": "exposed_allreduce_s", "comm/exposed_sparse_s": "exposed_sparse_s",
               "val/loss": "val_loss", "val/perplexity": "val_perplexity"}

    def _scalars(self, row: dict) -> None:
        for tag, key in self.SCALARS.items():
            if row.get(key) is not None:  # no validation this step, or no norm with a tie across stages
                self.board.add_scalar(tag, row[key], row["step"])
        if row.get("rank_peak_rss_mb"):
            self.board.add_scalar("memory/peak_rss_mb_max_rank", max(row["rank_peak_rss_mb"]), row["step"])
        self.board.flush()  # a run that dies keeps every step it reported

    def close(self) -> None:
        self.bar.close()
        if self.out:
            self.out.close()
        if self.board:
            self.board.close()

    def finish(self) -> list[dict]:
        self.close()
        steady = self.rows[1:] or self.rows  # the first step includes warm-up
        mean_dt = sum(r["step_time_s"] for r in steady) / len(steady)
        last = self.rows[-1]
        val = next((r["val_loss"] for r in reversed(self.rows) if r.get("val_loss") is not None), None)
        skipped = sum(r.get("skipped", False) for r in self.rows)
        peaks = [max(r["rank_peak_rss_mb"]) for r in self.rows if "rank_peak_rss_mb" in r]
        print(f"done: {self.cfg.model.name} {self.cfg.parallel.schedule} {self.cfg.comm.policy} pp={self.cfg.parallel.pp} dp={self.cfg.parallel.dp} "
              f"stages={self.sizes} {self.cfg.model.precision} | {len(self.rows)} steps, final loss {last['loss']:.4f}"
              + (f", val loss {val:.4f}" if val is not None else "")
              + (f", {skipped} update(s) skipped (non-finite)" if skipped else "")
              + f", {self.cfg.tokens_per_step / mean_dt:.0f} tokens/s, {mean_dt:.3f} s/step (mean after step 0)"
              + (f", lr {last['lr']:.3g}" if "lr" in last else "")
              + (f", peak {max(peaks):.0f} MB/rank" if peaks else ""), flush=True)
        return self.rows
