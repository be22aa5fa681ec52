"""A sweep's one directory, and the comparison of its points: ``summary_table.md``,
``summary_table.csv`` and ``summary_plot.png`` at the multirun root.

:class:`SweepSummary` is a Hydra callback (registered in ``conf/train.yaml``).

**One directory.** ``hydra.sweep.dir`` derives from ``hydra.run.dir``, whose resolvers
(``app/run_dir.py``) answer per process: under Hydra's submitit launcher each point is
composed again inside its own SLURM job, where the run name is ``slurm-<job>...``, so the
points would scatter away from the directory the launcher printed. When the multirun
starts, the launcher's process resolves the directory once, as an absolute path, and adds
it to the Hydra overrides every point's config is composed with (``hydra.overrides.hydra``,
which Hydra's launchers, the submitit ones included, apply to each job).

**The table.** It is written after every job of a multirun (in the job's process: on a
SLURM node under submitit, after each attempt of a requeued point), so a sweep cut short
or with a failed point still has the table of the points done, and once more when the
multirun ends. Each row is one point (a job directory): the overrides that differ between
the points, whether it finished, and its ``summary.json`` figures. A point's overrides are
read from its newest attempt's Hydra files (``.hydra/``, or ``.hydra_attempt-<time>/``
with ``ckpt_path=auto``). A multirun that ends with no point in its directory says so and
exits 1.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from typing_extensions import override

from odb_lightning.app.run_dir import lightning_rank

log = logging.getLogger(__name__)

FIGURES = (
    "mode",
    "optimizer_steps",
    "emitted_samples",
    "padding_efficiency",
    "budget_fill",
    "idle_steps",
    "real_tokens_per_s",
    "emitted_samples_per_s",
    "mfu",
    "loader_wait_share",
    "train_loss",
    "val_loss",
    "wall_s",
)
"""``summary.json`` keys compared, in this order (those no point has are left out)."""

PLOTTED = (
    ("real_tokens_per_s", "real tokens/s", True),
    ("padding_efficiency", "padding efficiency (real / padded tokens)", True),
    ("val_loss", "val loss (token-weighted)", False),
)
"""The comparison plot's panels: key, title, and whether the axis starts at zero (a rate or
a share: bars from zero; a loss: points on an axis fitted to the values, so 8.312 and 8.316
can be told apart)."""


def fitted_limits(values: Sequence[float]) -> tuple[float, float]:
    """The y range of a panel not drawn from zero: the values' span and a fifth of it on
    each side (a thousandth of the value, or 1, when every value is the same)."""
    low, high = min(values), max(values)
    margin = (high - low) / 5 or abs(high) / 1000 or 1.0
    return low - margin, high + margin


TABLE_NAME, CSV_NAME, PLOT_NAME = "summary_table.md", "summary_table.csv", "summary_plot.png"


@dataclass
class SweepPoint:
    """One job of the sweep."""

    job: str
    overrides: dict[str, str]
    summary: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    figures: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.figures = {k: (self.summary or {}).get(k) for k in FIGURES}

    @property
    def status(self) -> str:
        if self.summary is not None:
            return "ok"
        if self.failure is not None:
            return f"failed ({self.failure.get('error', 'error')})"
        return "no summary"


def _job_sort_key(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (1 << 30, path.name)


ATTEMPT_FILES = re.compile(r"\.hydra(_attempt-.+|_resumed-.+)?")
"""The Hydra files of a point's attempts as rank 0 writes them (``.hydra``, and with a
resume ``.hydra_attempt-<time>`` or ``.hydra_resumed-<time>``: ``app/run_dir.py``); the
other ranks' ``.hydra_rank<r>`` are not a point's."""


def attempt_overrides(job_dir: Path) -> Path | None:
    """The ``overrides.yaml`` of the newest attempt of the point in ``job_dir`` (the names
    carry the attempt's time, so they sort by it), or ``None`` when it is no point."""
    found = sorted(
        p / "overrides.yaml"
        for p in job_dir.iterdir()
        if ATTEMPT_FILES.fullmatch(p.name) and (p / "overrides.yaml").is_file()
    )
    return found[-1] if found else None


def _overrides(path: Path) -> dict[str, str]:
    items = OmegaConf.to_container(OmegaConf.load(path))
    return dict(item.split("=", 1) for item in items if "=" in item)  # type: ignore[union-attr]


def read_points(sweep_dir: Path) -> list[SweepPoint]:
    """Every job directory of ``sweep_dir`` (one with an attempt's Hydra files), by job
    number."""
    points = []
    found = {p: attempt_overrides(p) for p in sweep_dir.iterdir() if p.is_dir()}
    job_dirs = [p for p, overrides in found.items() if overrides is not None]
    for job_dir in sorted(job_dirs, key=_job_sort_key):
        summary = job_dir / "summary.json"
        failed = job_dir / "failed.json"
        points.append(
            SweepPoint(
                job=job_dir.name,
                overrides=_overrides(found[job_dir]),  # type: ignore[arg-type]
                summary=json.loads(summary.read_text()) if summary.is_file() else None,
                failure=json.loads(failed.read_text()) if failed.is_file() else None,
            )
        )
    return points


def varying_keys(points: Sequence[SweepPoint]) -> list[str]:
    """The override keys whose values differ between the points (all of them for one point)."""
    keys = sorted({k for p in points for k in p.overrides})
    if len(points) < 2:
        return keys
    return [k for k in keys if len({p.overrides.get(k) for p in points}) > 1]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def table_rows(points: Sequence[SweepPoint]) -> tuple[list[str], list[list[Any]]]:
    """Header and rows: job, the varying overrides, status, the figures any point has."""
    keys = varying_keys(points)
    figures = [k for k in FIGURES if any(p.figures[k] is not None for p in points)]
    header = ["job", *keys, "status", *figures]
    rows = [
        [p.job, *(p.overrides.get(k) for k in keys), p.status, *(p.figures[k] for k in figures)]
        for p in points
    ]
    return header, rows


SMOKE_NOTE = (
    "debug=smoke's body (one layer of width 32) is too small for real_tokens_per_s to "
    "show what the batching buys: its per-step overhead dominates, so padding_efficiency "
    "is the figure to compare here. The speed-up on a body that dominates the cost: "
    "python -m experiments.throughput.run (its figures: docs/measured.md)."
)
"""Said under a sweep of batching modes on ``debug=smoke``, whose tokens/s mislead."""


def smoke_note(points: Sequence[SweepPoint]) -> str | None:
    """:data:`SMOKE_NOTE` when the points compare batching modes on ``debug=smoke``."""
    smoke = any(p.overrides.get("debug") == "smoke" for p in points)
    return SMOKE_NOTE if smoke and "batching" in varying_keys(points) else None


def write_tables(sweep_dir: Path, points: Sequence[SweepPoint]) -> tuple[Path, Path]:
    """``summary_table.md`` (formatted, with :func:`smoke_note` where it applies) and
    ``summary_table.csv`` (exact values)."""
    header, rows = table_rows(points)
    markdown = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows),
    ]
    failed = [p for p in points if p.failure is not None]
    notes = [f"- job {p.job}: {p.failure.get('message', '')}" for p in failed if p.failure]
    md_path, csv_path = sweep_dir / TABLE_NAME, sweep_dir / CSV_NAME
    note = smoke_note(points)
    md_path.write_text(
        "\n".join(
            markdown
            + (["", "Failed points:", *notes] if notes else [])
            + (["", note] if note else [])
        )
        + "\n"
    )
    with csv_path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in row] for row in rows])
    return md_path, csv_path


def write_plot(sweep_dir: Path, points: Sequence[SweepPoint]) -> Path | None:
    """One figure, a bar per point in each of :data:`PLOTTED`'s panels; ``None`` when no
    point has a summary yet."""
    done = [p for p in points if p.summary is not None]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    keys = varying_keys(points)
    labels = [" ".join(f"{k}={p.overrides.get(k)}" for k in keys) or p.job for p in done]
    panels = [panel for panel in PLOTTED if any(p.figures[panel[0]] is not None for p in done)]
    figure, axes = plt.subplots(
        1, len(panels), figsize=(max(6.0, 1.2 * len(done)) * len(panels), 4.5), squeeze=False
    )
    for axis, (key, name, from_zero) in zip(axes[0], panels, strict=True):
        if from_zero:
            values = [p.figures[key] if p.figures[key] is not None else 0.0 for p in done]
            bars = axis.bar(range(len(done)), values, color="tab:blue")
            axis.bar_label(bars, fmt="%.4g", fontsize=8)
        else:  # a point per job that has the figure, on an axis fitted to the values
            shown = [(i, p.figures[key]) for i, p in enumerate(done) if p.figures[key] is not None]
            xs, ys = [i for i, _ in shown], [float(v) for _, v in shown]
            axis.plot(xs, ys, "o", color="tab:blue")
            for x, y in shown:
                axis.annotate(f"{y:.4f}", (x, y), textcoords="offset points", xytext=(0, 6),
                              ha="center", fontsize=8)  # fmt: skip
            axis.set_ylim(*fitted_limits(ys))
            axis.set_xlim(-0.5, len(done) - 0.5)
        axis.set_xticks(range(len(done)), labels, rotation=30, ha="right", fontsize=8)
        axis.set_title(name)
        axis.grid(axis="y", alpha=0.3)
    where = f"{sweep_dir.parent.name}/{sweep_dir.name}"
    figure.suptitle(f"sweep {where}: {len(done)} of {len(points)} points done")
    figure.tight_layout()
    path = sweep_dir / PLOT_NAME
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_sweep_summary(sweep_dir: Path) -> list[Path]:
    """The table (markdown and CSV) and the plot of every point of ``sweep_dir``."""
    points = read_points(sweep_dir)
    if not points:
        return []
    written = [*write_tables(sweep_dir, points)]
    plot = write_plot(sweep_dir, points)
    return written + ([plot] if plot is not None else [])


SWEEP_DIR_KEY = "hydra.sweep.dir"


def fix_sweep_dir(config: DictConfig) -> Path:
    """Resolve ``hydra.sweep.dir`` once, here, as an absolute path, and add it to the Hydra
    overrides each point's config is composed with (module docstring); the directory."""
    # Here, not at the top: a single run's Hydra callbacks load no Lightning (its checks
    # come first, in seconds); a multirun loads it anyway.
    from odb_lightning.lit.callbacks.checkpointing import hydra_override

    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    with read_write(config.hydra), open_dict(config.hydra):
        given = [o for o in config.hydra.overrides.hydra if not o.startswith(SWEEP_DIR_KEY + "=")]
        config.hydra.overrides.hydra = [*given, hydra_override(SWEEP_DIR_KEY, str(sweep_dir))]
        config.hydra.sweep.dir = str(sweep_dir)
    return sweep_dir


def no_point_message(sweep_dir: Path) -> str:
    """What a multirun that left no point in ``sweep_dir`` says."""
    return (
        f"the sweep has no point in {sweep_dir} (no job directory with Hydra's .hydra files): "
        "its jobs ran elsewhere or none started; no summary table. Look for the jobs' own "
        "logs (under submitit: hydra.launcher.submitit_folder), and pass "
        "hydra.sweep.dir=<a directory every job sees>"
    )


class SweepSummary(Callback):
    """Hydra callback: one sweep directory for every point (at the multirun's start), the
    sweep's comparison at its root after each job and at the end (rank 0 only: under
    Lightning's DDP launcher every rank runs the sweep)."""

    @override
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        fix_sweep_dir(config)

    @override
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode.name == "MULTIRUN" and lightning_rank() == 0:
            write_sweep_summary(Path(config.hydra.sweep.dir))

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if lightning_rank() != 0:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        written = write_sweep_summary(sweep_dir) if sweep_dir.is_dir() else []
        if not written:
            log.error(no_point_message(sweep_dir))
            raise SystemExit(1)  # Hydra turns a callback's Exception into a warning
        log.info("sweep summary: %s", ", ".join(str(p) for p in written))
        note = smoke_note(read_points(sweep_dir))
        if note:
            log.info(note)
