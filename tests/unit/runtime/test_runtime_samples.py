"""Sample validation, token counts, transport and collation of the runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from odb_lightning.core.rows import PackedRows, PaddedRows
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.window import Step
from odb_lightning.runtime import BadSampleError, idle_sample, pad_collate
from odb_lightning.runtime.batch import make_step_meta
from odb_lightning.runtime.transport import dump_sample, load_sample
from odb_lightning.sample import SampleLimits, inspect_sample, normalize_sample


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ([1, 2, 3], r"sample 9: field '<sample>' must be a mapping with 'input_ids', got list"),
        ({"input_ids": _ids(3, -1)}, r"sample 9: field 'input_ids' contains negative token id -1"),
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


INTEGER_DTYPES = [torch.uint8, torch.uint16, torch.uint32, torch.int8, torch.int16, torch.int32]


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
def test_integer_token_ids_are_widened_to_int64(dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 5, 127]).to(dtype)
    labels = torch.tensor([-100 if dtype.is_signed else 0, 5, 127]).to(dtype)
    extra = torch.ones(2)
    sample, stats = normalize_sample({"input_ids": ids, "labels": labels, "x": extra}, 0)
    assert sample["input_ids"].dtype == sample["labels"].dtype == torch.int64
    assert sample["input_ids"].tolist() == [0, 5, 127]
    assert sample["labels"].tolist() == labels.long().tolist()
    assert sample["x"] is extra and stats == (3, 2)


def test_numpy_memmap_slice_becomes_an_int64_tensor() -> None:
    tokens = np.array([65535, 3, 40000], dtype=np.uint16)
    tokens.setflags(write=False)  # as a slice of a read-only memmap is
    sample, stats = normalize_sample({"input_ids": tokens}, 2, SampleLimits(vocab_size=65536))
    assert sample["input_ids"].dtype == torch.int64
    assert sample["input_ids"].tolist() == [65535, 3, 40000] and stats == (3, 2)


NOT_BELOW = "not below the model's vocab_size=1000"


@pytest.mark.parametrize(
    ("sample", "field", "problem"),
    [
        ({"input_ids": np.ones(3)}, "input_ids", "must have an integer dtype, got float64"),
        ({"input_ids": np.ones(3, bool)}, "input_ids", "must have an integer dtype, got bool"),
        (
            {"input_ids": _ids(1, 2), "labels": np.ones(2, np.float16)},
            "labels",
            "must have an integer dtype, got float16",
        ),
        ({"input_ids": _ids(3, 1000)}, "input_ids", f"contains token id 1000, {NOT_BELOW}"),
        (
            {"input_ids": torch.tensor([3, 4000], dtype=torch.uint16)},
            "input_ids",
            f"contains token id 4000, {NOT_BELOW}",
        ),
        (
            {"input_ids": _ids(3, 4), "labels": _ids(-100, 1200)},
            "labels",
            f"contains token id 1200, {NOT_BELOW}",
        ),
        (
            {"input_ids": _ids(3, 4), "labels": _ids(-100, -7)},
            "labels",
            "contains negative value -7, other than -100 (no loss)",
        ),
    ],
)
def test_out_of_vocabulary_and_non_integer_ids_are_bad_samples(
    sample: object, field: str, problem: str
) -> None:
    with pytest.raises(BadSampleError) as info:
        inspect_sample(sample, 9, max_seq_len=None, vocab_size=1000)
    assert str(info.value) == f"sample 9: field '{field}' {problem}"
    assert (info.value.index, info.value.field, info.value.problem) == (9, field, problem)


def test_ids_below_the_vocabulary_and_ignored_labels_pass() -> None:
    sample = {"input_ids": _ids(0, 999), "labels": _ids(-100, 999)}
    assert inspect_sample(sample, 0, max_seq_len=None, vocab_size=1000) == (2, 1)


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


def test_moved_samples_cross_the_channel_compressed_and_come_back_whole() -> None:
    from odb_lightning.runtime.transport import MovedBytesError, pack_moved, unpack_moved

    # A text sample's payload: int64 ids below the vocabulary and labels -100 on the
    # prompt, as the chat datasets make them.
    ids = torch.randint(0, 151_000, (2048,), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:900] = -100
    blob = dump_sample({"input_ids": ids, "labels": labels}) * 3
    wire = pack_moved(blob)
    assert unpack_moved(wire) == blob
    assert len(wire) < len(blob) / 3, "token tensors shrink on the wire"
    with pytest.raises(MovedBytesError, match="do not decompress"):
        unpack_moved(blob[:100])


def test_pad_collate_pads_to_batch_max() -> None:
    batch = pad_collate(
        [{"input_ids": _ids(1, 2, 3), "labels": _ids(-100, 2, 3)}, {"input_ids": _ids(4)}],
        pad_id=7,
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [4, -100, -100]]


def test_pad_collate_pads_mixed_dtypes_in_int64() -> None:
    narrow = {"input_ids": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    wide = {"input_ids": _ids(300, 70000), "labels": _ids(-100, 70000)}
    batch = pad_collate([narrow, wide], pad_id=0)
    assert batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].tolist() == [[1, 2, 3], [300, 70000, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3], [-100, 70000, -100]]


def test_idle_batch_is_one_unsupervised_token() -> None:
    batch = pad_collate([idle_sample(pad_id=3)])
    assert batch["input_ids"].tolist() == [[3]]
    assert batch["labels"].tolist() == [[-100]]
    assert batch["attention_mask"].tolist() == [[1]]


def test_step_meta_counts_local_tokens() -> None:
    samples = (SampleInfo(4, 10, 6, 0), SampleInfo(2, 7, 3, 1))
    step = Step(Group(samples), global_samples=5, global_loss_tokens=30, round_index=2,
                index_in_round=1)  # fmt: skip
    meta = make_step_meta(step, step_index=9, epoch=1, rows=PaddedRows())
    assert meta.sample_ids == (4, 2) and not meta.is_idle
    assert (meta.local_samples, meta.local_real_tokens, meta.local_padded_tokens) == (2, 17, 20)
    assert (meta.local_loss_tokens, meta.global_samples, meta.global_loss_tokens) == (9, 5, 30)
    assert (meta.round_index, meta.step, meta.epoch) == (2, 9, 1)
    assert make_step_meta(step, step_index=9, epoch=1, rows=PackedRows()).local_padded_tokens == 17
    idle = make_step_meta(Step(None, 5, 30, 2, 0), step_index=3, epoch=1, rows=PaddedRows())
    assert idle.is_idle and idle.sample_ids == () and idle.local_samples == 0
