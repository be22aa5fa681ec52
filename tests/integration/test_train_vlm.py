"""``train.py`` on image-text data: the tiny Qwen2-VL, one process and two DDP ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.train_run import read_audit, train
from helpers.vlm import image_record, write_image, write_records
from odb_lightning.data import QwenTokenizer
from odb_lightning.data.sources.llava import llava_records
from odb_lightning.data.vision import ImageSettings
from odb_lightning.data.vision_dataset import VisionChatDataset

MAX_PIXELS = 112 * 112


def write_small_set(directory: Path, count: int) -> Path:
    """``count`` records, every third text-only, pictures of varied small sizes."""
    records = []
    for k in range(count):
        if k % 3 == 2:
            records.append(image_record(f"r{k}", [], [f"text question {k}?"]))
            continue
        write_image(directory / f"i{k}.png", 30 + 17 * k, 140 - 4 * k, seed=k)
        records.append(image_record(f"r{k}", [f"i{k}.png"], [f"what is in {k}?"]))
    return write_records(directory / "set.jsonl", records)


@pytest.mark.slow
def test_two_ranks_every_image_sample_once(tmp_path: Path) -> None:
    data = write_small_set(tmp_path, 25)
    run_dir = tmp_path / "run"
    summary = train(
        run_dir,
        "experiment=llava_odb",
        "trainer=ddp_cpu",
        "audit_ids=true",
        "data.source.name=llava_jsonl",
        f"data.source.path={data}",
        "data.sizes.max_samples=null",
        "data.sizes.val_samples=0",
        f"data.images.max_pixels={MAX_PIXELS}",
        "batching.policy.max_steps_per_round=1",
        "batching.policy.outstanding_depth=8",
        "batching.token_budget=512",
        "data.sizes.max_seq_len=512",
    )
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"]
    emitted = sorted(i for rank in audit for step in rank for i in step)
    assert emitted == list(range(25))
    dataset = VisionChatDataset(
        llava_records(data).records,
        QwenTokenizer(),
        2048,
        images=ImageSettings(max_pixels=MAX_PIXELS),
        image_root=tmp_path,
    )
    expected = [dataset[i]["num_image_tokens"] for i in range(25)]
    assert summary["image_tokens"] == sum(expected) > 0
    assert summary["image_patches"] == 4 * sum(expected)
    assert summary["emitted_samples"] == 25 and summary["train_loss"] > 0


@pytest.mark.slow
def test_llava_odb_experiment_runs(tmp_path: Path) -> None:
    summary = train(
        tmp_path / "run",
        "experiment=llava_odb",
        "data.sizes.max_samples=24",
        "data.sizes.val_samples=4",
        f"data.caches.image_set_dir={tmp_path / 'sets'}",
    )
    assert summary["emitted_samples"] == 20 and summary["source"] == "llava"
    assert summary["image_tokens"] > 0 and summary["val_loss"] > 0
