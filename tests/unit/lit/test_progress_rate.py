"""The training bar's rate and ETA count from the end of the first step (fake clock)."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from odb_lightning.lit.callbacks.progress import SteadyRateTqdm


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _bar(clock: FakeClock, total: int) -> SteadyRateTqdm:
    return SteadyRateTqdm(total=total, file=io.StringIO(), smoothing=0, clock=clock)


def test_rate_and_eta_ignore_a_slow_first_step() -> None:
    clock = FakeClock()
    bar = _bar(clock, total=1001)
    clock.now = 180.0  # the first step waits 3 minutes for the window
    bar.update(1)
    bar.start_rate_clock(1)
    assert bar.rate_clock_steps == 1
    assert bar.format_dict["rate"] == 0, "no rate until a step ends after the first"
    assert "<?" in tqdm.format_meter(**bar.format_dict)
    for _ in range(10):  # then a second a step
        clock.now += 1.0
        bar.update(1)
    figures = bar.format_dict
    assert figures["rate"] == pytest.approx(1.0)
    assert "<16:30" in tqdm.format_meter(**figures)  # 990 steps left at 1 step/s
    # Control: tqdm's own rate (11 steps over the 190 s since the reset) gives 4 h 45 min.
    control = tqdm.format_meter(**(figures | {"rate": None, "elapsed": 190.0}))
    assert "<4:45:00" in control
    bar.close()


def test_reset_stops_the_rate_clock() -> None:
    clock = FakeClock()
    bar = _bar(clock, total=10)
    clock.now = 5.0
    bar.update(1)
    bar.start_rate_clock(1)
    bar.reset(total=20)  # the next epoch
    assert bar.rate_clock_steps is None
    assert bar.format_dict["rate"] is None, "tqdm's own rate until the clock starts again"
    bar.close()
