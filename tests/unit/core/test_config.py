"""The batching configuration: typed, validated once, and every error names its Hydra key."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import (
    DataHandshake,
    SettingsMismatchError,
    check_data_agree,
    check_settings_agree,
    handshake_message,
)
from odb_lightning.core.loader_config import LoaderConfig, OnBadSample, StartMethod
from odb_lightning.core.modes import MODES
from odb_lightning.core.online_policy import ShardDealing
from odb_lightning.core.policy import StandardPolicy
from odb_lightning.core.rows import PackedRows
from odb_lightning.core.wire import RankReport, WireFormatError, decode_report, encode_report
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.pipeline import output_slots


class SchemaContext(Enum):
    """A config schema's own enum with the same values."""

    SPAWN = "spawn"


def test_defaults_and_enum_coercion() -> None:
    assert (
        BatchingConfig.of(
            token_budget=64, multiprocessing_context=SchemaContext.SPAWN
        ).loader.multiprocessing_context
        is StartMethod.SPAWN
    )
    config = BatchingConfig.of(
        token_budget=4096, on_bad_sample="skip", multiprocessing_context="spawn"
    )
    assert config.loader.on_bad_sample is OnBadSample.SKIP
    assert config.loader.multiprocessing_context is StartMethod.SPAWN
    assert output_slots(config) == 64
    assert output_slots(BatchingConfig.of(max_steps_per_round=8)) == 16
    assert config.handshake() == BatchingConfig.of(token_budget=4096).handshake()
    bucketed = BatchingConfig.of(mode="bucketed", boundaries=[0, 10, 20])
    assert bucketed.policy.boundaries == (0, 10, 20)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_budget", 0),
        ("outstanding_depth", -1),
        ("max_steps_per_round", 0),
        ("num_workers", -1),
        ("timeout_s", 0.0),
        ("alignment_timeout_s", float("inf")),
        ("join", 1),
        ("persistent_workers", "yes"),
        ("mode", "packed"),
        ("on_bad_sample", "ignore"),
        ("multiprocessing_context", "threads"),
        ("attention_weight", -0.5),
        ("seed", 1.5),
        ("batch_size", 0),
        ("max_batch_size", 0),
        ("num_buckets", 0),
        ("boundaries", [0, 60, 40]),
    ],
)
def test_invalid_values_name_the_hydra_key(field: str, value: object) -> None:
    # The knob's own mode: the fixed-size and bucketed knobs live in those policies.
    mode = {"batch_size": "standard", "max_batch_size": "bucketed"}.get(field, "odb")
    mode = "bucketed" if field in ("num_buckets", "boundaries") else mode
    settings = {"token_budget": 1024, **({} if field == "mode" else {"mode": mode})}
    with pytest.raises(ValueError, match=rf"^batching\.((policy|rows|loader)\.)?{field}"):
        BatchingConfig.of(**{**settings, field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("pad_id", -2), ("max_seq_len", 0)])
def test_loader_arguments_outside_the_config_are_checked(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        ODBLoader([], token_budget=64, num_workers=0, **{field: value})


def test_keyword_form_replaces_fields_by_name() -> None:
    base = BatchingConfig.of(token_budget=2048, seed=4)
    assert BatchingConfig.of(base) is base
    assert BatchingConfig.of(base, join=False) == BatchingConfig.of(
        token_budget=2048, seed=4, join=False
    )
    assert BatchingConfig.of(None, token_budget=8) == BatchingConfig.of(token_budget=8)
    with pytest.raises(TypeError, match="unknown batching settings \\['window'\\]"):
        BatchingConfig.of(None, window=8)


def test_planned_mode_is_refused_by_the_online_loader() -> None:
    with pytest.raises(ValueError, match="planned modes use PlannedLoader"):
        ODBLoader([], mode="standard", num_workers=0)


def test_handshake_names_the_first_setting_that_differs() -> None:
    one = BatchingConfig.of(token_budget=1024, outstanding_depth=32)
    other = BatchingConfig.of(token_budget=1024, outstanding_depth=64, mode="odb_packed")
    check_settings_agree([one.handshake(), one.handshake()])
    with pytest.raises(
        SettingsMismatchError, match="'outstanding_depth' \\(rank 0: 32, rank 1: 64\\)"
    ):
        check_settings_agree([one.handshake(), other.handshake()])
    packed = BatchingConfig.of(token_budget=1024, outstanding_depth=32, mode="odb_packed")
    with pytest.raises(SettingsMismatchError, match="'mode'"):
        check_settings_agree([one.handshake(), packed.handshake()])
    # Knobs that do not change the plan may differ between ranks.
    check_settings_agree([one.handshake(), BatchingConfig.of(one, num_workers=0).handshake()])


def test_grouping_across_ranks_applies_where_it_can_and_the_handshake_tells_its_three_values() -> (
    None
):
    default = BatchingConfig.of(token_budget=1024)
    assert default.policy.cross_rank_grouping is None and default.policy.groups_across_ranks
    # Unset, it follows the dealing: fixed shards or no join leave each rank alone.
    assert not BatchingConfig.of(default, shard_dealing="fixed").policy.groups_across_ranks
    assert not BatchingConfig.of(default, join=False).policy.groups_across_ranks
    assert not BatchingConfig.of(default, cross_rank_grouping=False).policy.groups_across_ranks
    with pytest.raises(ValueError, match="cross_rank_grouping must be a bool, got 'yes'"):
        BatchingConfig.of(default, cross_rank_grouping="yes")
    messages = {
        value: BatchingConfig.of(default, cross_rank_grouping=value).handshake()
        for value in (None, True, False)
    }
    for a, b in [(None, False), (None, True), (True, False)]:
        with pytest.raises(SettingsMismatchError, match="'cross_rank_grouping'"):
            check_settings_agree([messages[a], messages[b]])


def _data_messages(*data: DataHandshake | None) -> list[list[int]]:
    config = BatchingConfig.of(token_budget=64)
    return [handshake_message(config, d) for d in data]


def test_data_handshake_names_the_field_and_every_rank_value() -> None:
    check_data_agree(_data_messages(DataHandshake.of(50, None, 0, None), None))  # None: unknown
    with pytest.raises(
        SettingsMismatchError, match=r"ranks disagree on len\(dataset\): rank 0: 50, rank 1: 60;"
    ):
        check_data_agree(
            _data_messages(DataHandshake.of(50, None, 0, None), DataHandshake.of(60, None, 0, None))
        )
    with pytest.raises(SettingsMismatchError, match="max_seq_len: rank 0: 0, rank 1: 512"):
        check_data_agree(
            _data_messages(DataHandshake.of(50, None, 0, None), DataHandshake.of(50, 512, 0, None))
        )
    with pytest.raises(SettingsMismatchError, match="sharding: rank 0: default, rank 1: shard="):
        check_data_agree(
            _data_messages(DataHandshake.of(9, None, 0, None), DataHandshake.of(9, None, 0, [1]))
        )


def test_user_shards_that_overlap_are_detected_from_sizes_and_digests() -> None:
    def shards(*per_rank: list[int]) -> list[list[int]]:
        return _data_messages(*(DataHandshake.of(50, None, 3, ids) for ids in per_rank))

    check_data_agree(shards(list(range(0, 50, 2)), list(range(49, 0, -2))))  # a partition
    check_data_agree(shards(list(range(10)), list(range(5, 20))))  # a part: not checked
    with pytest.raises(
        SettingsMismatchError,
        match=r"overlap in epoch 3: shard sizes \(rank 0: 30, rank 1: 30\) sum to 60, more",
    ):
        check_data_agree(shards(list(range(30)), list(range(20, 50))))
    with pytest.raises(SettingsMismatchError, match=r"sum to len\(dataset\) 50 but"):
        check_data_agree(shards(list(range(25)), list(range(20, 45))))
    with pytest.raises(SettingsMismatchError, match="not a partition"):  # a duplicate in one
        check_data_agree(shards([0, *range(25)][:25], list(range(25, 50))))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (0, 9, "wire version 9"),
        (3, 7, "aborted is 7, expected 0 or 1"),
        (6, -5, "buffered is -5"),
        (7, 1 << 40, "num_groups is 1099511627776, more than max_steps_per_round 4"),
        (16, -1, r"group_sizes\[1\] is -1"),
        (23, -3, r"peel_loss_tokens\[0\] is -3"),
        (12, -6, "dealt_samples is -6"),
        (13, -7, "wait_us is -7"),
        (14, -8, "elapsed_us is -8"),
        (10, 2, "full is 2, expected 0 or 1"),
        (8, -4, "undealt is -4"),
    ],
)
def test_garbage_reports_fail_naming_the_field(field: int, value: int, expected: str) -> None:
    message = encode_report(RankReport(0, 2, False, False, 4, 3, 2, (1, 2), (5, 6)), 4)
    decode_report(message, 4)
    message[field] = value
    with pytest.raises(WireFormatError, match=expected):
        decode_report(message, 4)


def test_window_and_dealing_knobs_are_checked_and_shared() -> None:
    with pytest.raises(
        ValueError, match=r"batching\.policy\.window_budgets must be a positive integer"
    ):
        BatchingConfig.of(window_budgets=0)
    with pytest.raises(
        ValueError, match=r"batching\.policy\.shard_dealing must be one of fixed, by_need"
    ):
        BatchingConfig.of(shard_dealing="round_robin")
    assert BatchingConfig.of(shard_dealing="fixed").policy.shard_dealing is ShardDealing.FIXED
    assert BatchingConfig.of(window_budgets=None).policy.window_budgets is None
    one = BatchingConfig.of()
    for other in (
        BatchingConfig.of(window_budgets=32),
        BatchingConfig.of(shard_dealing="fixed"),
    ):
        with pytest.raises(SettingsMismatchError):
            check_settings_agree([one.handshake(), other.handshake()])


def test_loader_refuses_fixed_shards_dealt_by_need() -> None:
    with pytest.raises(ValueError, match="give order= .* or shard_dealing=fixed"):
        ODBLoader([], shard=lambda epoch: [], shard_dealing="by_need", num_workers=0)
    with pytest.raises(ValueError, match="with shard_dealing=fixed give shard="):
        ODBLoader([], order=lambda epoch: [], shard_dealing="fixed", num_workers=0)


def test_ranks_dealt_by_need_must_give_the_same_order() -> None:
    def orders(*per_rank: list[int]) -> list[list[int]]:
        config = BatchingConfig.of().handshake()
        return [config + DataHandshake.of(6, None, 1, o, order=True).encode() for o in per_rank]

    check_data_agree(orders([5, 1, 0, 2, 3, 4], [5, 1, 0, 2, 3, 4]))
    with pytest.raises(SettingsMismatchError, match=r"order= indices \(size\): rank 0: 6"):
        check_data_agree(orders([5, 1, 0, 2, 3, 4], [5, 1, 0]))
    with pytest.raises(SettingsMismatchError, match=r"order= indices \(digest\)"):
        check_data_agree(orders([5, 1, 0, 2, 3, 4], [5, 1, 0, 2, 3, 3]))
    # The same indices in another order deal different samples to each rank: refused.
    with pytest.raises(SettingsMismatchError, match=r"order= indices \(digest\)"):
        check_data_agree(orders([5, 1, 0, 2, 3, 4], [0, 1, 2, 3, 4, 5]))
    fixed = BatchingConfig.of().handshake() + DataHandshake.of(6, None, 1, [0, 1, 2]).encode()
    with pytest.raises(SettingsMismatchError, match=r"shard= \(or order=\) on every rank"):
        check_data_agree([orders([5, 1, 0, 2, 3, 4])[0], fixed])


def test_keyword_form_routes_each_knob_to_its_concern() -> None:
    config = BatchingConfig.of(
        mode="odb_packed", token_budget=8192, outstanding_depth=64, num_workers=0
    )
    assert config.mode == "odb_packed" and isinstance(config.rows, PackedRows)
    assert config.policy.outstanding_depth == 64 and config.loader.num_workers == 0
    assert config.knob("outstanding_depth") == 64 and config.knob("mode") == "odb_packed"
    # Switching mode keeps the fields both layouts have; another policy's knob is not read.
    padded = BatchingConfig.of(config, mode="oracle", pad_to_multiple_of=8, batch_size=4)
    assert padded.mode == "oracle" and padded.rows.pad_to_multiple_of == 8
    assert padded.knob("batch_size") is None and padded.knob("outstanding_depth") is None
    with pytest.raises(KeyError, match="'window'"):
        config.knob("window")


def test_every_registered_mode_is_its_policy_and_layout() -> None:
    for name, mode in MODES.items():
        config = BatchingConfig(policy=mode.policy(), rows=mode.rows())
        assert config.mode == name == BatchingConfig.of(mode=name).mode
    assert [m for m, e in MODES.items() if e.policy.online] == ["odb", "odb_packed"]
    assert {m for m, e in MODES.items() if e.policy.needs_length_pass} == {
        "sorted",
        "bucketed",
        "oracle",
    }
    with pytest.raises(ValueError, match=r"^batching\.policy StandardPolicy with batching\.rows"):
        BatchingConfig(policy=StandardPolicy(), rows=PackedRows())


def test_knob_names_are_unique_across_concerns() -> None:
    def names(kind: type) -> set[str]:
        return {f.name for f in dataclasses.fields(kind)}

    policies = set().union(*(names(m.policy) for m in MODES.values()))
    layouts = set().union(*(names(m.rows) for m in MODES.values()))
    top = names(BatchingConfig) - {"policy", "rows", "loader"}
    concerns = [top, policies, layouts, names(LoaderConfig)]
    assert sum(map(len, concerns)) == len(set().union(*concerns))  # one owner per name


def test_every_mode_has_a_handshake_and_modes_differ_in_it() -> None:
    messages = {name: BatchingConfig.of(mode=name).handshake() for name in MODES}
    assert len({tuple(m) for m in messages.values()}) == len(MODES)
    with pytest.raises(SettingsMismatchError, match="mode"):
        check_settings_agree([messages["standard"], messages["oracle"]])
