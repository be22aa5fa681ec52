"""Sample validation, token counts, transport and collation of the runtime."""

from __future__ import annotations

import pytest
import torch

from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.window import Step
from odb_lightning.runtime import BadSampleError, idle_sample, pad_collate
from odb_lightning.runtime.batch import make_step_meta
from odb_lightning.runtime.transport import dump_sample, load_sample
from odb_lightning.sample import inspect_sample


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ([1, 2, 3], r"sample 9: field '<sample>' must be a mapping with 'input_ids', got list"),
        ({"input_ids": _ids(3, -1)}, r"sample 9: field 'input_ids' contains negative token ids"),
        ({"labels": _ids(1)}, r"sample 9: field 'input_ids' is missing"),
        ({"input_ids": [1, 2]}, r"sample 9: field 'input_ids' must be a torch.Tensor"),
        ({"input_ids": torch.ones(3)}, r"sample 9: field 'input_ids' must have an integer dtype"),
        ({"input_ids": torch.ones(3, dtype=torch.bool)}, r"'input_ids' must have an integer"),
        ({"input_ids": torch.ones(2, 3, dtype=torch.long)}, r"'input_ids' must be 1-D, got shape"),
        ({"input_ids": _ids()}, r"sample 9: field 'input_ids' is empty"),
        ({"input_ids": _ids(*range(9))}, r"'input_ids' has 9 tokens, more than max_seq_len=8"),
        ({"input_ids": _ids(1, 2), "labels": _ids(1)}, r"sample 9: field 'labels' has shape"),
        ({"input_ids": _ids(1, 2), "labels": torch.ones(2)}, r"field 'labels' must have an int"),
    ],
)
def test_bad_samples_name_index_and_field(sample: object, message: str) -> None:
    with pytest.raises(BadSampleError, match=message) as info:
        inspect_sample(sample, 9, max_seq_len=8)
    assert info.value.index == 9 and info.value.field in message


def test_loss_tokens_count_shifted_supervised_labels() -> None:
    sample = {"input_ids": _ids(5, 6, 7, 8, 9), "labels": _ids(5, -100, 7, -100, 9)}
    assert inspect_sample(sample, 0, max_seq_len=None) == (5, 2)  # position 0 never counts
    assert inspect_sample({"input_ids": _ids(5, 6, 7)}, 0, max_seq_len=3) == (3, 2)
    assert inspect_sample({"input_ids": _ids(5, 6).int(), "labels": _ids(-100, -100)}, 0, None) == (
        2,
        0,
    )


def test_transport_round_trip_keeps_values_and_dtypes() -> None:
    sample = {
        "input_ids": _ids(1, 2, 3),
        "pixel_values": torch.randn(2, 3).to(torch.bfloat16),
        "strided": torch.arange(10)[::3],
        "text": "hello",
    }
    loaded = load_sample(dump_sample(sample))
    assert loaded["text"] == "hello"
    for key in ("input_ids", "pixel_values", "strided"):
        assert loaded[key].dtype == sample[key].dtype
        assert torch.equal(loaded[key], sample[key])


def test_pad_collate_pads_to_batch_max() -> None:
    batch = pad_collate(
        [{"input_ids": _ids(1, 2, 3), "labels": _ids(-100, 2, 3)}, {"input_ids": _ids(4)}],
        pad_id=7,
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [4, -100, -100]]


def test_idle_batch_is_one_unsupervised_token() -> None:
    batch = pad_collate([idle_sample(pad_id=3)])
    assert batch["input_ids"].tolist() == [[3]]
    assert batch["labels"].tolist() == [[-100]]
    assert batch["attention_mask"].tolist() == [[1]]


def test_step_meta_counts_local_tokens() -> None:
    samples = (SampleInfo(4, 10, 6, 0), SampleInfo(2, 7, 3, 1))
    step = Step(Group(samples), global_samples=5, global_loss_tokens=30, round_index=2,
                index_in_round=1)  # fmt: skip
    meta = make_step_meta(step, step_index=9, epoch=1, packed=False)
    assert meta.sample_ids == (4, 2) and not meta.is_idle
    assert (meta.local_samples, meta.local_real_tokens, meta.local_padded_tokens) == (2, 17, 20)
    assert (meta.local_loss_tokens, meta.global_samples, meta.global_loss_tokens) == (9, 5, 30)
    assert (meta.round_index, meta.step, meta.epoch) == (2, 9, 1)
    assert make_step_meta(step, step_index=9, epoch=1, packed=True).local_padded_tokens == 17
    idle = make_step_meta(Step(None, 5, 30, 2, 0), step_index=3, epoch=1, packed=False)
    assert idle.is_idle and idle.sample_ids == () and idle.local_samples == 0
