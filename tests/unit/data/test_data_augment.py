"""Seeded augmentation: validated settings, determinism in (seed, epoch, index), lengths that
move between epochs, a supervised exchange always kept, labels still masked."""

from __future__ import annotations

import copy
import json
import pickle
from collections import Counter

import pytest
import torch

from odb_lightning.data import (
    DEFAULT_SYSTEM_PROMPTS,
    IGNORE_INDEX,
    Augmentation,
    ChatDataset,
    QwenTokenizer,
    augment_messages,
)
from odb_lightning.data.augment import trailing_cut_points


def _conversation(i: int, exchanges: int) -> list[dict[str, str]]:
    messages = []
    for k in range(exchanges):
        messages.append({"role": "user", "content": f"Question {k} of chat {i}: why {k}?"})
        messages.append({"role": "assistant", "content": f"Because {k}. " * (3 + (i + k) % 7)})
    return messages


RECORDS = [{"id": i, "messages": _conversation(i, 1 + i % 4)} for i in range(120)]
BOTH = Augmentation(
    system_prompts=DEFAULT_SYSTEM_PROMPTS,
    system_prompt_probability=0.5,
    drop_trailing_turns_probability=0.5,
    seed=7,
)


@pytest.mark.parametrize(
    ("fields", "error", "field"),
    [
        ({"system_prompt_probability": 1.5}, ValueError, "system_prompt_probability"),
        ({"drop_trailing_turns_probability": -0.1}, ValueError, "drop_trailing_turns"),
        ({"drop_trailing_turns_probability": float("nan")}, ValueError, "drop_trailing_turns"),
        ({"drop_trailing_turns_probability": "0.5"}, TypeError, "drop_trailing_turns"),
        ({"system_prompt_probability": 0.3}, ValueError, "system_prompts"),
        ({"system_prompts": ("ok", "")}, ValueError, r"system_prompts\[1\]"),
        ({"system_prompts": "You are helpful."}, TypeError, "system_prompts"),
        ({"seed": True}, TypeError, "seed"),
    ],
)
def test_invalid_settings_name_the_field(fields: dict, error: type, field: str) -> None:
    with pytest.raises(error, match=f"augmentation.{field}"):
        Augmentation(**fields)


def test_settings_enabled_and_fingerprint() -> None:
    assert not Augmentation().enabled
    assert not Augmentation(system_prompts=("a",)).enabled
    listed = Augmentation(system_prompts=["a", "b"], system_prompt_probability=1)
    assert listed.enabled and listed.system_prompts == ("a", "b")
    assert listed == Augmentation(system_prompts=("a", "b"), system_prompt_probability=1.0)
    assert json.loads(BOTH.fingerprint) == {
        "drop_trailing_turns_probability": 0.5,
        "seed": 7,
        "system_prompt_probability": 0.5,
        "system_prompts": list(DEFAULT_SYSTEM_PROMPTS),
    }
    variants = {
        BOTH.fingerprint,
        Augmentation(BOTH.system_prompts, 0.5, 0.5, seed=8).fingerprint,
        Augmentation(BOTH.system_prompts, 0.4, 0.5, seed=7).fingerprint,
        Augmentation(BOTH.system_prompts, 0.5, 0.6, seed=7).fingerprint,
        Augmentation(BOTH.system_prompts[:2], 0.5, 0.5, seed=7).fingerprint,
    }
    assert len(variants) == 5


def test_deterministic_in_seed_epoch_index() -> None:
    for index, record in enumerate(RECORDS):
        first = augment_messages(record["messages"], BOTH, epoch=3, index=index)
        assert augment_messages(record["messages"], BOTH, epoch=3, index=index) == first
    other_seed = Augmentation(BOTH.system_prompts, 0.5, 0.5, seed=8)

    def augmented(augmentation: Augmentation, epoch: int) -> list[list[dict[str, str]]]:
        return [
            augment_messages(r["messages"], augmentation, epoch, i) for i, r in enumerate(RECORDS)
        ]

    base = augmented(BOTH, 0)
    for other in (augmented(other_seed, 0), augmented(BOTH, 1)):
        assert sum(a != b for a, b in zip(base, other, strict=True)) >= len(RECORDS) // 3


def test_records_are_not_modified() -> None:
    records = copy.deepcopy(RECORDS)
    always = Augmentation(DEFAULT_SYSTEM_PROMPTS, 1.0, 1.0)
    for index, record in enumerate(records):
        augment_messages(record["messages"], always, epoch=0, index=index)
    assert records == RECORDS


@pytest.mark.parametrize(
    "roles",
    [
        "ua",
        "uaua",
        "uauaua",
        "uau",
        "auaua",
        "sua",
        "suaua",
        "aua",
        "uu",
        "",
    ],
)
def test_drop_keeps_a_supervised_exchange(roles: str) -> None:
    names = {"u": "user", "a": "assistant", "s": "system"}
    messages = [{"role": names[r], "content": f"turn {k}"} for k, r in enumerate(roles)]
    always = Augmentation(drop_trailing_turns_probability=1.0)
    cuts = trailing_cut_points(messages)
    kept_lengths = Counter()
    for index in range(200):
        result = augment_messages(messages, always, epoch=0, index=index)
        assert result == messages[: len(result)]  # a prefix: only trailing turns go
        kept_lengths[len(result)] += 1
        if cuts:  # probability 1 and somewhere to cut: always shorter
            assert len(result) < len(messages)
            assert result[-1]["role"] == "assistant"
            assert any(m["role"] == "user" for m in result[:-1])
        else:
            assert result == messages
    assert set(kept_lengths) == (set(cuts) or {len(messages)})  # every cut point is used


def test_cut_points_of_regular_chat() -> None:
    # u a u a u a u a: keep 1, 2 or 3 exchanges (drop 3, 2 or 1 trailing pairs).
    assert trailing_cut_points(_conversation(0, 4)) == [2, 4, 6]
    assert trailing_cut_points(_conversation(0, 1)) == []


def test_system_prompt_choice_and_own_prompt_kept() -> None:
    prompts = ("P0", "P1", "P2")
    always = Augmentation(prompts, system_prompt_probability=1.0)
    chosen = Counter(
        augment_messages(RECORDS[0]["messages"], always, 0, index)[0]["content"]
        for index in range(600)
    )
    assert set(chosen) == set(prompts)
    assert all(150 <= count <= 250 for count in chosen.values()), chosen  # 200 expected
    own = [{"role": "system", "content": "Own."}, *RECORDS[1]["messages"]]
    assert augment_messages(own, always, 0, 1) == own
    half = Augmentation(prompts, system_prompt_probability=0.25)
    added = sum(
        augment_messages(RECORDS[0]["messages"], half, 0, index)[0]["role"] == "system"
        for index in range(800)
    )
    assert 150 <= added <= 250  # 200 expected


def test_lengths_move_between_epochs(tokenizer: QwenTokenizer) -> None:
    dataset = ChatDataset(RECORDS, tokenizer, max_seq_len=4096, augmentation=BOTH)
    lengths = []
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        lengths.append([dataset[i]["input_ids"].numel() for i in range(len(dataset))])
    changed = sum(a != b for a, b in zip(*lengths, strict=True)) / len(dataset)
    # Same length needs the same prompt outcome (none: 0.5, each of 5 prompts: 0.1, so
    # P = 0.25 + 5 * 0.01 = 0.3) and the same drop outcome (1 exchange: always; 4
    # exchanges: 0.25 + 3 * (1/6)^2 = 0.33): about 82% of samples change (measured 80-82%).
    assert changed >= 0.65, changed
    plain = ChatDataset(RECORDS, tokenizer, max_seq_len=4096)
    plain_lengths = [plain[i]["input_ids"].numel() for i in range(len(plain))]
    assert sum(lengths[0]) != sum(plain_lengths)


def test_set_epoch_changes_items_and_is_reproducible(tokenizer: QwenTokenizer) -> None:
    dataset = ChatDataset(RECORDS[:40], tokenizer, max_seq_len=4096, augmentation=BOTH)
    dataset.set_epoch(0)
    epoch0 = [dataset[i]["input_ids"].tolist() for i in range(40)]
    dataset.set_epoch(1)
    epoch1 = [dataset[i]["input_ids"].tolist() for i in range(40)]
    assert sum(a != b for a, b in zip(epoch0, epoch1, strict=True)) >= 15
    dataset.set_epoch(0)
    assert [dataset[i]["input_ids"].tolist() for i in range(40)] == epoch0


def test_labels_supervise_only_assistant_content(tokenizer: QwenTokenizer) -> None:
    always = Augmentation(DEFAULT_SYSTEM_PROMPTS, 1.0, 1.0, seed=3)
    dataset = ChatDataset(RECORDS[:30], tokenizer, max_seq_len=4096, augmentation=always)
    for index in range(len(dataset)):
        sample = dataset[index]
        messages = augment_messages(RECORDS[index]["messages"], always, 0, index)
        assert messages[0]["role"] == "system"
        expected = [
            token
            for m in messages
            if m["role"] == "assistant"
            for token in [*tokenizer.encode_text(m["content"]), tokenizer.im_end_id]
        ]
        supervised = sample["input_ids"][sample["labels"] != IGNORE_INDEX].tolist()
        assert supervised == expected
        assert tokenizer.decode(sample["input_ids"].tolist()).count("<|im_start|>") == len(messages)


def test_pickles_cheaply_and_identically(tokenizer: QwenTokenizer) -> None:
    plain = ChatDataset(RECORDS, tokenizer, max_seq_len=4096)
    dataset = ChatDataset(RECORDS, tokenizer, max_seq_len=4096, augmentation=BOTH)
    dataset.set_epoch(5)
    payload = pickle.dumps(dataset)
    assert len(payload) - len(pickle.dumps(plain)) < 1024
    clone = pickle.loads(payload)
    assert clone.epoch == 5
    for index in range(0, len(RECORDS), 7):
        assert torch.equal(clone[index]["input_ids"], dataset[index]["input_ids"])


def test_length_settings_name_the_augmentation(tokenizer: QwenTokenizer) -> None:
    off = ChatDataset(RECORDS, tokenizer, 64, augmentation=Augmentation(seed=3))
    assert off.length_settings() == ChatDataset(RECORDS, tokenizer, 64).length_settings()
    on = ChatDataset(RECORDS, tokenizer, 64, augmentation=BOTH)
    assert on.length_settings()["augmentation"] == BOTH.fingerprint
