"""``data.sizes.truncation``: each policy, and the default never trains an answer without
its end-of-turn token; dropped samples counted and named."""

from __future__ import annotations

import pytest

from odb_lightning.data import (
    IGNORE_INDEX,
    ChatDataset,
    QwenTokenizer,
    Truncation,
    build_chat_template,
)
from odb_lightning.data.config import DataSizes
from odb_lightning.data.plain_text import tokenize_record
from odb_lightning.lit.data.skipped_records import NO_SUPERVISED_TOKEN, unsupervised_entries
from odb_lightning.lit.data.train_records import count_train_records
from odb_lightning.sample import TRUNCATED_FROM, count_loss_tokens

IM_END = 151645
SYSTEM = {"role": "system", "content": "Be brief."}
EXCHANGES = [
    [
        {"role": "user", "content": f"Question {k}: " + "why " * 10 * k},
        {"role": "assistant", "content": f"Answer {k}. " * 5},
    ]
    for k in (1, 2, 3)
]
CHAT = [SYSTEM, *(m for pair in EXCHANGES for m in pair)]


@pytest.fixture(scope="module")
def template(tokenizer: QwenTokenizer):
    return build_chat_template(tokenizer, "chatml")


def _supervised_runs(labels: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for k, label in enumerate(labels):
        if label != IGNORE_INDEX:
            if k == 0 or labels[k - 1] == IGNORE_INDEX:
                runs.append([])
            runs[-1].append(label)
    return runs


def test_turns_cuts_whole_exchanges_from_the_start_keeping_the_system_turn(template) -> None:
    whole = template.tokenize(CHAT)
    last = template.tokenize([SYSTEM, *EXCHANGES[2]])
    two = template.tokenize([SYSTEM, *EXCHANGES[1], *EXCHANGES[2]])
    for max_seq_len, expected in ((two.length, two), (two.length - 1, last), (last.length, last)):
        cut = template.tokenize(CHAT, max_seq_len, Truncation.TURNS)
        assert (cut.input_ids, cut.labels) == (expected.input_ids, expected.labels)
        assert cut.truncated and cut.full_length == whole.length and not cut.dropped
    # The last exchange alone does not fit: dropped, never cut inside an answer.
    dropped = template.tokenize(CHAT, last.length - 1, Truncation.TURNS)
    assert dropped.dropped and dropped.num_loss_tokens == 0
    assert dropped.input_ids == whole.input_ids[: last.length - 1]


def test_drop_drops_what_does_not_fit(template) -> None:
    whole = template.tokenize(CHAT)
    assert template.tokenize(CHAT, whole.length, Truncation.DROP).input_ids == whole.input_ids
    cut = template.tokenize(CHAT, whole.length - 1, Truncation.DROP)
    assert cut.dropped and cut.input_ids == whole.input_ids[:-1]
    assert cut.labels == [IGNORE_INDEX] * (whole.length - 1)
    assert cut.truncated and cut.full_length == whole.length


def test_tail_cuts_the_end_even_inside_an_answer(template) -> None:
    whole = template.tokenize(CHAT)
    cut = template.tokenize(CHAT, whole.length - 3, Truncation.TAIL)
    assert cut.input_ids == whole.input_ids[:-3] and cut.labels == whole.labels[:-3]
    assert _supervised_runs(cut.labels)[-1][-1] != IM_END  # the answer lost its end


def test_the_default_never_trains_an_answer_without_its_end_of_turn(template) -> None:
    assert DataSizes().truncation is Truncation.TURNS
    whole = template.tokenize(CHAT)
    outcomes = {"kept": 0, "cut": 0, "dropped": 0}
    for max_seq_len in range(1, whole.length + 2):
        chat = template.tokenize(CHAT, max_seq_len)
        assert chat.length <= max_seq_len
        runs = _supervised_runs(chat.labels)
        assert all(run[-1] == IM_END for run in runs), max_seq_len
        outcomes["dropped" if chat.dropped else "cut" if chat.truncated else "kept"] += 1
        assert chat.dropped or count_loss_tokens(chat.labels) > 0
    assert all(outcomes.values())  # every outcome was met


def test_a_long_user_turn_leaving_nothing_to_learn_is_dropped(template) -> None:
    long_user = [
        {"role": "user", "content": "word " * 300},
        {"role": "assistant", "content": "Ok."},
    ]
    for truncation in Truncation:
        chat = template.tokenize(long_user, 100, truncation)
        assert chat.dropped and chat.num_loss_tokens == 0, truncation


def test_a_plain_completion_is_kept_whole_or_dropped_except_under_tail(template) -> None:
    record = [
        {"role": "prompt", "content": "Once "},
        {"role": "completion", "content": "upon " * 50},
    ]
    whole = tokenize_record(template, record)
    assert tokenize_record(template, record, 10, Truncation.TURNS).dropped
    assert tokenize_record(template, record, 10, Truncation.DROP).dropped
    tail = tokenize_record(template, record, 10, Truncation.TAIL)
    assert tail.input_ids == whole.input_ids[:10] and not tail.dropped


def test_dropped_samples_are_counted_and_named(tokenizer: QwenTokenizer) -> None:
    records = [{"id": "short", "messages": CHAT[:3]}, {"id": "long", "messages": CHAT}]
    short = build_chat_template(tokenizer, "chatml").tokenize(CHAT[:3]).length
    dataset = ChatDataset(records, tokenizer, short, template="chatml", truncation="drop")
    samples = [dataset[0], dataset[1]]
    assert TRUNCATED_FROM not in samples[0] and samples[1][TRUNCATED_FROM] > short
    lengths = [len(s["input_ids"]) for s in samples]
    loss_tokens = [count_loss_tokens(s["labels"].tolist()) for s in samples]
    counts, unsupervised = count_train_records(dataset, [0, 1], lengths, loss_tokens, short)
    assert counts["unsupervised_samples"] == 1 and unsupervised == [1]
    entries = unsupervised_entries(
        "jsonl", [dataset.record_id(i) for i in unsupervised], exact=True
    )
    assert entries == [{"source": "jsonl", "record": "long", "reason": NO_SUPERVISED_TOKEN}]
    assert "data.sizes.truncation" in NO_SUPERVISED_TOKEN
    assert dataset.length_settings()["truncation"] == "drop"


def test_an_unknown_policy_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"data.sizes.truncation must be one of turns, drop, tail"):
        DataSizes(truncation="middle")


def test_the_knobs_are_hydra_keys_checked_once(compose_cfg, tmp_path) -> None:
    from odb_lightning.app.validation import ConfigError, instantiate_checked

    overrides = ["data=jsonl", f"data.source.path={tmp_path / 'chats.jsonl'}"]
    cfg = compose_cfg([*overrides, "data.sizes.truncation=drop", "data.source.think_block=prompt"])
    sizes = instantiate_checked(cfg.data.sizes, "data.sizes")
    source = instantiate_checked(cfg.data.source, "data.source")
    assert (sizes.truncation, source.think_block) == (Truncation.DROP, "prompt")
    bad = compose_cfg([*overrides, "data.sizes.truncation=middle"])
    with pytest.raises(ConfigError, match=r"invalid config 'data.sizes.truncation': data.sizes"):
        instantiate_checked(bad.data.sizes, "data.sizes")
