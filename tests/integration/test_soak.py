"""Ten short epochs on 2 ranks with 2 workers each: open file descriptors, child processes
and memory stay bounded (``experiments/soak`` runs 30 epochs on real chat data)."""

from __future__ import annotations

import pytest

from testing.harness.datasets import SyntheticChatDataset
from testing.harness.ranks import RankJob, run_ranks

EPOCHS = 10
MIB = 1 << 20
LOADER = {
    "token_budget": 600,
    "outstanding_depth": 32,
    "max_steps_per_round": 4,
    "multiprocessing_context": "fork",
    "num_workers": 2,
}


@pytest.mark.parametrize("persistent", [False, True], ids=["rebuilt", "persistent"])
def test_resources_stay_bounded_over_epochs(persistent: bool) -> None:
    job = RankJob(
        SyntheticChatDataset.seeded(600),
        {**LOADER, "persistent_workers": persistent},
        epochs=EPOCHS,
        probe_resources=True,
    )
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    for rank in range(2):
        samples = [epoch["resources"] for epoch in outcome.ok[rank]]
        assert [s["mid_epoch"]["children"] for s in samples] == [3] * EPOCHS
        assert [s["epoch_end"]["children"] for s in samples] == [3 if persistent else 0] * EPOCHS
        mid = [s["mid_epoch"]["open_fds"] for s in samples]
        assert max(mid) - min(mid) <= 1, mid
        # Right after a pipeline closes, queue threads may still be closing their pipes:
        # a few transient descriptors, but the floor must not rise (a leak would).
        end = [s["epoch_end"]["open_fds"] for s in samples]
        half = EPOCHS // 2
        assert min(end[half:]) <= min(end[:half]), end
        assert max(end) - min(end) <= 8, end
        rss = [s["epoch_end"]["rss_bytes"] for s in samples]
        assert rss[-1] - rss[0] < 16 * MIB, rss
        child_rss = [s["mid_epoch"]["max_child_rss_bytes"] for s in samples]
        assert child_rss[-1] - child_rss[0] < 16 * MIB, child_rss
        assert sum(epoch["stats"].emitted_samples for epoch in outcome.ok[rank]) > 0
