"""Step metrics at 2 gloo ranks: the logged step and forward time max/mean are the
max/mean of the ranks' own times, and the per-device rates sum both ranks' counts.

The test starts this file as a script under torchrun (2 ranks); each rank fits
``MeteredModule`` under ``DDPStrategy(process_group_backend="gloo")`` with the callback,
rank 1 sleeping longer in each forward, and saves its own windows (what it measured) and what the
cross-rank reduction gave, at every logged window and for the run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.metered import CONFIG, MeteredModule, metered_batches
from helpers.tiny_lm import hand_over, quiet_trainer
from helpers.torchrun import leave_ranks, run_script_on_ranks
from odb_lightning.lit.callbacks.step_metrics import StepMetricsCallback, Window
from odb_lightning.lit.model.flops import ModelFlops

WORLD_SIZE = 2
LOG_EVERY = 2
# RANK_STEPS[rank][step]: sample lengths (None: IDLE); the same step count on both ranks.
RANK_STEPS = [
    [[9, 4], [12], [3, 3, 3], [7], [5, 2], [11]],
    [[6], None, [8, 8], [10], [4], [2, 2]],
]
SLEEP_S = [0.005, 0.04]


class RecordingMetrics(StepMetricsCallback):
    """Keeps this rank's window of every reduction and the reduced figures."""

    def __init__(self) -> None:
        super().__init__(log_every_n_steps=LOG_EVERY)
        self.windows: list[Window] = []
        self.reduced: list[dict[str, float]] = []

    @override
    def _take_window(self) -> Window:
        window = super()._take_window()
        self.windows.append(window)
        return window

    @override
    def _log_window(self, trainer: Any, pl_module: Any) -> None:
        super()._log_window(trainer, pl_module)
        self.reduced.append(dict(self.last_logged))


def fit_rank(out_dir: Path) -> None:
    callback = RecordingMetrics()
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=1,
        use_distributed_sampler=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[callback],
    )
    rank = trainer.global_rank
    module = MeteredModule(step_sleep_s=SLEEP_S[rank])
    loader = DataLoader(metered_batches(RANK_STEPS[rank]), batch_size=None, collate_fn=hand_over)
    trainer.fit(module, train_dataloaders=loader)
    run = callback.summary_entries(trainer, module)  # both ranks: one all-gather
    record = {
        "windows": [w.row() for w in callback.windows],
        "reduced": callback.reduced,
        "run": run,
        "logged": {k: float(v) for k, v in trainer.callback_metrics.items()},
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))


@pytest.mark.slow  # torchrun starts two ranks that import Lightning: 10-20 s on two cores
def test_step_time_max_mean_and_rates_over_two_ranks(tmp_path: Path) -> None:
    run_script_on_ranks(__file__, str(tmp_path), ranks=WORLD_SIZE)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    windows = [[Window(*row) for row in rec["windows"]] for rec in records]
    logged_windows = len(RANK_STEPS[0]) // LOG_EVERY
    for rec in records:
        assert len(rec["reduced"]) == logged_windows  # every rank took part every time
    for k in range(logged_windows):
        own = [windows[r][k] for r in range(WORLD_SIZE)]  # what each rank measured
        step_s = [w.step_s / w.steps for w in own]
        forward_s = [w.forward_s / w.forward_steps for w in own]
        assert forward_s[1] > forward_s[0] + 0.02  # the slow rank's forward is the slow one
        for rec in records:  # both ranks hold the same reduction
            reduced = rec["reduced"][k]
            assert reduced["step_time_max_s"] == max(step_s)
            assert reduced["step_time_mean_s"] == pytest.approx(statistics.fmean(step_s))
            assert reduced["forward_time_max_s"] == forward_s[1]
            assert reduced["forward_time_mean_s"] == pytest.approx(statistics.fmean(forward_s))
            tokens = sum(sum(s or ()) for rank in RANK_STEPS for s in rank[2 * k : 2 * k + 2])
            assert sum(w.real_tokens for w in own) == tokens
            wall = max(w.wall_s for w in own)
            assert reduced["tokens_per_s_per_device"] == pytest.approx(tokens / wall / WORLD_SIZE)
    # Rank 0 logs the last window's figures (Lightning keeps them as float32).
    last = records[0]["reduced"][-1]
    for name in ("step_time_max_s", "forward_time_max_s", "tokens_per_s_per_device"):
        assert records[0]["logged"][f"perf/{name}"] == pytest.approx(last[name], rel=1e-6)
    # The run: every rank's steps, model FLOPs from the samples' own lengths.
    flops = ModelFlops.of(CONFIG)
    expected = sum(flops.step(s, sum(n // 2 for n in s)) for rank in RANK_STEPS for s in rank if s)
    run_step_s = [sum(w.step_s for w in ws) / sum(w.steps for w in ws) for ws in windows]
    for rec in records:
        assert rec["run"]["model_flops"] == expected
        assert rec["run"]["step_time_s_per_rank"] == pytest.approx(run_step_s)
        assert rec["run"]["step_time_max_s"] == pytest.approx(max(run_step_s))
        assert rec["run"]["step_time_mean_s"] == pytest.approx(statistics.fmean(run_step_s))


if __name__ == "__main__":
    fit_rank(Path(sys.argv[1]))
    leave_ranks()
