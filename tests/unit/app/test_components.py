"""The app's wiring (``app/components.py``): the run context built from the module and the
config, and each component handed the objects it needs, never finding them itself."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from helpers.configs import ComposeConfig
from odb_lightning.app.components import build_callbacks, build_parts, launched_world
from odb_lightning.app.validation import ConfigError
from odb_lightning.lit.callbacks.counters import StepCounters
from odb_lightning.lit.callbacks.id_audit import IdAudit
from odb_lightning.lit.callbacks.length_mix import StepLengthMix
from odb_lightning.lit.callbacks.progress import ODBProgressBar
from odb_lightning.lit.callbacks.step_metrics import StepMetricsCallback
from odb_lightning.lit.callbacks.summary import SummaryBuilder
from odb_lightning.lit.callbacks.supervision import SupervisionCheck
from odb_lightning.lit.memory.warmup import MemoryWarmup


@pytest.mark.parametrize(
    ("trainer", "world"),
    [({"accelerator": "cpu", "devices": 1}, 1), ({"accelerator": "cpu", "devices": 2}, 2),
     ({"accelerator": "cpu", "devices": 2, "num_nodes": 3}, 6), ({"accelerator": "cpu"}, 1)],
)  # fmt: skip
def test_launched_world_counts_devices_times_nodes(trainer: dict, world: int) -> None:
    assert launched_world(OmegaConf.create(trainer)) == (world, "cpu")


def test_devices_the_trainer_would_refuse_name_the_trainer_key() -> None:
    with pytest.raises(ConfigError, match="invalid config 'trainer': accelerator=cpu devices=-1"):
        launched_world(OmegaConf.create({"accelerator": "cpu", "devices": -1}))


def test_parts_share_one_run_context(compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg(["debug=smoke"])
    parts = build_parts(cfg, world_size=1, device="cpu")
    run = parts.run
    assert parts.datamodule.run is run
    assert parts.sizes is parts.datamodule.sizes
    assert parts.sizes.max_seq_len == cfg.data.sizes.max_seq_len
    # debug=smoke folds token ids to 4,096: the embedding has 4,096 rows, and the loaders
    # check nothing (every id is folded into range by the module).
    assert run.vocab_size is None and parts.embedding_rows == 4096
    assert not run.train_samples.known
    parts.datamodule.setup("fit")
    assert run.train_samples.get() == len(parts.datamodule.train_indices) == 64
    unfolded = build_parts(
        compose_cfg(["debug=smoke", "model.architecture.token_id_fold=null"]), 1, "cpu"
    )
    assert unfolded.run.vocab_size == unfolded.embedding_rows == cfg.model.architecture.vocab_size


def test_callbacks_get_their_objects_from_the_app(compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg(["debug=smoke", "audit_ids=true"])
    parts = build_parts(cfg, world_size=1, device="cpu")
    wired = build_callbacks(cfg.callbacks, parts)
    kinds = [type(c) for c in wired.callbacks]
    # The counters count a step before the step metrics log its rates and the bar shows them.
    assert kinds.index(StepCounters) < kinds.index(StepMetricsCallback)
    assert kinds.index(StepMetricsCallback) < kinds.index(ODBProgressBar)
    assert kinds[-1] is SummaryBuilder and wired.summary is wired.callbacks[-1]
    by_kind = {type(c): c for c in wired.callbacks}
    counters = by_kind[StepCounters]
    assert by_kind[StepMetricsCallback].counters is counters
    assert by_kind[SupervisionCheck].counters is counters
    assert by_kind[SupervisionCheck].max_seq_len == cfg.data.sizes.max_seq_len
    assert by_kind[ODBProgressBar].train_samples is parts.run.train_samples
    audit = by_kind[IdAudit]
    assert audit.enabled and audit.record_ids == parts.datamodule.record_ids
    warmup = by_kind[MemoryWarmup]
    assert warmup.batching is parts.batching and warmup.vocab_size == parts.embedding_rows
    assert warmup.apply_token_budget == parts.datamodule.apply_token_budget
    assert warmup.length_range == parts.datamodule.length_range
    assert warmup.largest_image == parts.datamodule.largest_image
    summary = wired.summary
    assert summary.counters is counters and summary.run_report is parts.datamodule
    assert summary.parameters is parts.model and summary.compiled is parts.model
    assert list(summary.extras) == [by_kind[StepMetricsCallback], by_kind[StepLengthMix], warmup]
    # The budget the warm-up resolves reaches the data module's loaders.
    warmup.apply_token_budget(1536)
    assert parts.datamodule.batching.token_budget == 1536


def test_a_rows_cost_is_the_models_flops_unless_the_config_sets_a_weight(
    compose_cfg: ComposeConfig,
) -> None:
    from odb_lightning.app.components import build_data
    from odb_lightning.core.rows import PackedAttention

    cfg = compose_cfg(["debug=smoke"])
    data = build_data(cfg, world_size=1, device="cpu")
    weight = data.architecture.attention_weight()
    # The smoke model: 1 layer of 32 (2 heads of 16, 1 key/value head, an MLP of 64) and
    # a 4,096-row folded head.
    layers, width = 1, 32
    matmul = layers * (width * 16 * (2 * 2 + 2 * 1) + 3 * width * 64) + width * 4096
    assert weight == pytest.approx(layers * width / matmul) and weight > 0
    assert data.batching.rows.attention_weight == weight
    assert data.datamodule.batching is data.batching, "the loaders get the resolved cost"
    # A number overrides it; 0 counts tokens only.
    tokens = build_data(compose_cfg(["debug=smoke", "batching.rows.attention_weight=0"]), 1, "cpu")
    assert tokens.batching.rows.attention_weight == 0.0
    # Packed rows take the backend's attention: sdpa computes the dense square.
    packed = build_data(compose_cfg(["debug=smoke", "batching=odb_packed"]), 1, "cpu")
    assert packed.batching.rows.attention_weight == weight
    assert packed.batching.rows.packed_attention is PackedAttention.DENSE
