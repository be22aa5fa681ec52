"""Image-text samples: visual tokens in the observed length, never supervised; sources;
the bad-input policy for image files and placeholders."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from helpers.vlm import image_record, write_image, write_records
from odb_lightning.core.loader_config import OnBadSample
from odb_lightning.data import BadRecordError, build_chat_template
from odb_lightning.data.image_generator import ResolutionProfile
from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.sources.llava import llava_records
from odb_lightning.data.vision import ImageSettings
from odb_lightning.data.vision_dataset import VisionChatDataset, tokenize_with_images
from odb_lightning.data.vision_family import ImageProcessor, Qwen2VLFamily
from odb_lightning.runtime.messages import FetchedSample, FetchRequest, SampleFailed, SampleSkipped
from odb_lightning.runtime.transport import load_sample
from odb_lightning.runtime.worker import fetch_sample

SETTINGS = ImageSettings(max_pixels=512 * 28 * 28, max_image_pixels=1500 * 1500)
VISION = Qwen2VLFamily.of_tokenizer(QwenTokenizer()).tokens  # the tokenizer's own ids
# (width, height): below min_pixels, not multiples of 28, tall, wide, above max_pixels.
RESOLUTIONS = [(40, 30), (300, 500), (1000, 200), (97, 1203), (1400, 1000)]


def _dataset(tmp_path: Path, records: list[dict], tokenizer, **kwargs) -> VisionChatDataset:
    path = write_records(tmp_path / "set.jsonl", records)
    source = llava_records(path)
    return VisionChatDataset(
        source.records,
        tokenizer,
        kwargs.pop("max_seq_len", 8192),
        images=SETTINGS,
        image_root=tmp_path,
        **kwargs,
    )


def _fetch(dataset, index: int, skip: bool = False):
    policy = OnBadSample.SKIP if skip else OnBadSample.RAISE
    return fetch_sample(dataset, FetchRequest(0, index), policy, 8192)


def test_observed_length_is_text_plus_visual_tokens(tmp_path: Path, tokenizer) -> None:
    records = []
    for k, (w, h) in enumerate(RESOLUTIONS):
        write_image(tmp_path / f"img{k}.png", w, h, seed=k)
        records.append(image_record(f"r{k}", [f"img{k}.png"], [f"what is in picture {k}?"]))
    # Two images in one record, in two turns.
    records.append(image_record("two", ["img0.png", "img3.png"], ["first?", "second?"]))
    dataset = _dataset(tmp_path, records, tokenizer)
    for index, record in enumerate(records):
        fetched = _fetch(dataset, index)
        assert isinstance(fetched, FetchedSample)
        sample = load_sample(fetched.payload)
        grids = sample["image_grid_thw"]
        # The grid follows each image's own resolution (smart resize of its size).
        sizes = [RESOLUTIONS[int(p[3])] for p in record["images"]]
        processor = ImageProcessor(SETTINGS)
        assert [tuple(g.tolist()) for g in grids] == [processor.grid(h, w) for w, h in sizes]
        # The record's text with empty image blocks: <|vision_start|><|vision_end|> each.
        text_tokens = tokenize_with_images(
            record["messages"], tokenizer, [0] * len(grids), dataset.vision_tokens, None
        ).length
        image_tokens = sum(int(g.prod()) // 4 for g in grids)
        # Each image adds its tokens between its <|vision_start|> and <|vision_end|>.
        assert fetched.length == text_tokens + image_tokens
        assert fetched.num_image_tokens == image_tokens
        assert fetched.num_patches == int(grids.prod(dim=-1).sum())
        assert fetched.patch_square_sum == sum(int(g.prod()) ** 2 for g in grids)
        assert sample["pixel_values"].shape == (fetched.num_patches, SETTINGS.patch_dim)
        assert sample["position_ids"].shape == (4, fetched.length)


def test_visual_tokens_are_never_supervised(tmp_path: Path, tokenizer) -> None:
    write_image(tmp_path / "a.png", 320, 240)
    record = image_record("r", ["a.png"], ["describe", "and again"])
    dataset = _dataset(tmp_path, [record], tokenizer)
    sample = dataset[0]
    ids, labels = sample["input_ids"], sample["labels"]
    is_vision = torch.isin(ids, torch.tensor(sorted(VISION.ids)))
    assert int(is_vision.sum()) == sample["num_image_tokens"] + 2
    assert bool((labels[is_vision] == -100).all())
    # The supervised tokens are exactly the template's: the answers and their <|im_end|>.
    text_only = [{**m, "content": m["content"].replace("<image>", "")} for m in record["messages"]]
    chat = build_chat_template(tokenizer, "chatml").tokenize(text_only)
    expected = [t for t in chat.labels if t != -100]
    assert labels[labels != -100].tolist() == expected


def test_text_only_record_equals_the_chat_template(tmp_path: Path, tokenizer) -> None:
    record = {
        "id": "t",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi!"},
        ],
    }
    sample = _dataset(tmp_path, [record], tokenizer)[0]
    chat = build_chat_template(tokenizer, "chatml").tokenize(record["messages"])
    assert sample["input_ids"].tolist() == chat.input_ids
    assert sample["labels"].tolist() == chat.labels
    assert sample["pixel_values"].shape == (0, SETTINGS.patch_dim)
    assert sample["image_grid_thw"].shape == (0, 3)
    assert torch.equal(sample["position_ids"], torch.arange(chat.length).expand(4, -1))


def _bad_records(tmp_path: Path) -> list[tuple[dict, str, str]]:
    write_image(tmp_path / "ok.png", 64, 64)
    write_image(tmp_path / "huge.png", 1600, 1500)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really an image")
    return [
        (image_record("missing", ["nope.png"], ["q"]), "images[0]", "names no file"),
        (image_record("corrupt", ["corrupt.png"], ["q"]), "images[0]", "cannot be decoded"),
        (
            image_record("huge", ["huge.png"], ["q"]),
            "images[0]",
            "more than images.max_image_pixels",
        ),
        (image_record("extra_path", ["ok.png", "ok.png"], ["q"]), "images", "2 path(s)"),
        (
            {
                "id": "no_path",
                "images": [],
                "messages": [
                    {"role": "user", "content": "<image> what?"},
                    {"role": "assistant", "content": "x"},
                ],
            },
            "images",
            "1 '<image>' placeholder",
        ),
        (
            {
                "id": "in_answer",
                "images": ["ok.png"],
                "messages": [
                    {"role": "user", "content": "what?"},
                    {"role": "assistant", "content": "<image>"},
                ],
            },
            "messages[1].content",
            "assistant turn",
        ),
    ]


def test_bad_image_inputs_name_the_record_and_field(tmp_path: Path, tokenizer) -> None:
    cases = _bad_records(tmp_path)
    dataset = _dataset(tmp_path, [r for r, _, _ in cases], tokenizer)
    for index, (record, field, problem) in enumerate(cases):
        failed = _fetch(dataset, index)
        assert isinstance(failed, SampleFailed) and failed.bad_sample, record["id"]
        assert failed.field == field
        assert problem in failed.message
        assert f"sample {index}" in failed.message
        assert repr(record["id"]) in failed.message  # the record id of the user's file
        skipped = _fetch(dataset, index, skip=True)
        assert isinstance(skipped, SampleSkipped) and skipped.dataset_index == index


def test_a_cut_through_an_image_is_a_bad_sample(tmp_path: Path, tokenizer) -> None:
    write_image(tmp_path / "a.png", 280, 280)  # 100 image tokens
    records = [image_record("r", ["a.png"], ["q"])]
    failed = _fetch(_dataset(tmp_path, records, tokenizer, max_seq_len=50), 0)
    assert isinstance(failed, SampleFailed) and failed.field == "images"
    assert "max_seq_len=50" in failed.message and "split an image" in failed.message
    # A cut after the image keeps it whole and marks the sample truncated.
    long_answer = image_record("r", ["a.png"], ["q"])
    long_answer["messages"][1]["content"] = "word " * 200
    fetched = _fetch(_dataset(tmp_path, [long_answer], tokenizer, max_seq_len=150), 0)
    assert isinstance(fetched, FetchedSample) and fetched.truncated and fetched.length == 150
    assert fetched.num_image_tokens == 100


def test_llava_records_read_both_layouts_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"id": 1, "images": ["a.png"], "messages": [{"role": "user", "content": "<image>"}]}\n'
        '{"id": 2, "image": "b.png", "conversations": [{"from": "human", "value": "<image>"},'
        ' {"from": "gpt", "value": "ok"}]}\n'
        "\n"
        '{"id": 3, "messages": [{"role": "user", "content": "text only"}]}\n'
        '{"id": 4, "images": "c.png", "messages": [{"role": "user", "content": "x"}]}\n'
    )
    with pytest.raises(BadRecordError, match=r"mixed.jsonl:5: field 'images'"):
        llava_records(path)
    source = llava_records(path, on_bad_record="skip")
    assert [r["images"] for r in source.records] == [["a.png"], ["b.png"], []]
    assert source.records[1]["messages"][1] == {"role": "assistant", "content": "ok"}
    assert source.counts["read"] == 4 and source.counts["kept"] == 3
    assert source.counts["dropped/bad_record"] == 1
    assert source.counts["images"] == 2 and source.counts["text_only"] == 1


def test_resolution_profile_draws_its_mean_and_cv() -> None:
    profile = ResolutionProfile(mean_pixels=400_000, cv=0.5)
    sizes = profile.draw(4000, seed=3)
    pixels = [w * h for w, h in sizes]
    mean = statistics.fmean(pixels)
    assert mean == pytest.approx(400_000, rel=0.05)
    assert statistics.pstdev(pixels) / mean == pytest.approx(0.5, rel=0.1)
    assert profile.draw(10, seed=3) == sizes[:10]  # seeded, prefix-stable
    assert {round(w / h, 1) for w, h in sizes} <= {round(a, 1) for a in profile.aspects}


def test_epoch_stats_count_the_emitted_image_tokens_and_patches(tmp_path: Path, tokenizer) -> None:
    from odb_lightning.runtime import ODBLoader

    records = []
    for k in range(12):
        if k % 3:  # a third of the records are text only
            write_image(tmp_path / f"i{k}.png", 60 + 40 * k, 300 - 15 * k, seed=k)
            records.append(image_record(f"r{k}", [f"i{k}.png"], [f"q{k}"]))
        else:
            records.append(image_record(f"r{k}", [], [f"text question {k}"]))
    dataset = _dataset(tmp_path, records, tokenizer)
    with ODBLoader(dataset, token_budget=1024, outstanding_depth=6, num_workers=0) as loader:
        batches = list(loader)
    stats = loader.last_epoch_stats
    emitted = [i for b in batches for i in b.meta.sample_ids]
    assert sorted(emitted) == list(range(12))
    pad_tokens = sum(int((b.inputs["input_ids"] == VISION.image_pad_id).sum()) for b in batches)
    patches = sum(int(b.inputs["image_grid_thw"].prod(dim=-1).sum()) for b in batches)
    assert stats.image_tokens == pad_tokens > 0
    assert stats.image_patches == patches == 4 * pad_tokens
    assert sum(b.inputs["pixel_values"].shape[0] for b in batches) == patches


def test_the_vision_ids_are_read_from_the_tokenizer(tokenizer) -> None:
    from odb_lightning.data.vision import VisionTokens

    # The Qwen2.5 tokenizer's added tokens, as its tokenizer_config lists them.
    expected = VisionTokens(vision_start_id=151652, vision_end_id=151653, image_pad_id=151655)
    assert Qwen2VLFamily.of_tokenizer(tokenizer).tokens == expected

    class Renumbered:
        ids = {"<|vision_start|>": 7, "<|vision_end|>": 8, "<|image_pad|>": 9}

        def special_token_id(self, token: str) -> int:
            return self.ids[token]

    renumbered = Qwen2VLFamily.of_tokenizer(Renumbered()).tokens
    assert (renumbered.vision_start_id, renumbered.vision_end_id, renumbered.image_pad_id) == (
        7,
        8,
        9,
    )
    with pytest.raises(ValueError, match=r"names no special tokens: image-text data reads"):
        Qwen2VLFamily.of_tokenizer(object())
