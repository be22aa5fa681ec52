"""The metadata channel's point-to-point bytes (a pooled round's moved samples): each rank
receives exactly what every other rank sent it, and nothing meant for a third rank."""

from __future__ import annotations

import threading

import torch.distributed as dist

from odb_lightning.core.config import BatchingConfig
from odb_lightning.runtime import Rendezvous, exchange

WORLD = 3


def _payload(source: int, target: int) -> bytes:
    """Distinct bytes per pair; rank 1 sends rank 2 nothing, so one split is empty."""
    if (source, target) == (1, 2):
        return b""
    return bytes([16 * source + target]) * (1000 * (source + 1) + 7 * target)


def test_send_bytes_delivers_each_rank_only_what_is_sent_to_it() -> None:
    config = BatchingConfig.of(token_budget=64, max_steps_per_round=4, alignment_timeout_s=30.0)
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    outcomes: list[object] = [None] * WORLD

    def run(rank: int) -> None:
        try:
            rendezvous = Rendezvous("127.0.0.1", store.port, rank, WORLD, "bytes")
            channel = exchange.open_channel(config, rendezvous, generation=0)
            try:
                to = {t: _payload(rank, t) for t in range(WORLD) if t != rank}
                first = channel.send_bytes(to, "round 1")
                second = channel.send_bytes({}, "round 2")  # a round where nothing moves
                outcomes[rank] = (first, second)
            finally:
                channel.close()
        except Exception as error:  # asserted on below
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)  # against a hang only
    assert not any(thread.is_alive() for thread in threads), outcomes
    for rank, outcome in enumerate(outcomes):
        assert isinstance(outcome, tuple), outcome
        first, second = outcome
        expected = [b"" if s == rank else _payload(s, rank) for s in range(WORLD)]
        assert first == expected
        assert second == [b""] * WORLD


def test_a_single_rank_sends_itself_nothing_but_what_it_names() -> None:
    channel = exchange.LocalChannel()
    assert channel.send_bytes({}, "round 1") == [b""]
    assert channel.send_bytes({0: b"abc"}, "round 1") == [b"abc"]
