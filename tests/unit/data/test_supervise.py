"""``data.source.supervise``: every assistant turn (the default), the last one, or every
token carries the loss; the length cache tells the three apart."""

from __future__ import annotations

import pytest

from odb_lightning.data.config import DataSource
from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.template_choice import build_chat_template, template_fingerprint

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "and?"},
    {"role": "assistant", "content": "ok"},
]
WHOLE = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nand?<|im_end|>\n"
    "<|im_start|>assistant\nok<|im_end|>\n"
)


@pytest.fixture(scope="module")
def tokenizer() -> QwenTokenizer:
    return QwenTokenizer()


def supervised_text(tokenizer: QwenTokenizer, supervise: str, chat=CHAT, **kw) -> str:
    template = build_chat_template(tokenizer, "chatml", supervise=supervise)
    tokenized = template.tokenize(chat, **kw)
    pairs = zip(tokenized.input_ids, tokenized.labels, strict=True)
    return tokenizer.decode([token for token, label in pairs if label >= 0])


@pytest.mark.parametrize(
    ("supervise", "expected"),
    [
        ("assistant", "yo<|im_end|>ok<|im_end|>"),
        ("last_assistant", "ok<|im_end|>"),
        ("all", WHOLE),
    ],
)
def test_each_switch_supervises_its_tokens(tokenizer, supervise: str, expected: str) -> None:
    assert supervised_text(tokenizer, supervise) == expected


def test_the_token_ids_are_the_same_under_every_switch(tokenizer) -> None:
    ids = {
        s: build_chat_template(tokenizer, "chatml", supervise=s).tokenize(CHAT).input_ids
        for s in ("assistant", "last_assistant", "all")
    }
    assert ids["assistant"] == ids["last_assistant"] == ids["all"]
    assert tokenizer.decode(ids["all"]) == WHOLE


def test_turns_cut_from_the_start_keep_the_last_answer_supervised(tokenizer) -> None:
    full = build_chat_template(tokenizer, "chatml").tokenize(CHAT).length
    text = supervised_text(tokenizer, "last_assistant", max_seq_len=full - 5)
    assert text == "ok<|im_end|>"


def test_the_length_cache_key_tells_the_switches_apart(tokenizer) -> None:
    keys = {
        s: template_fingerprint(build_chat_template(tokenizer, "chatml", supervise=s))
        for s in ("assistant", "last_assistant", "all")
    }
    assert keys["assistant"] == "chatml/think=generation"  # the caches made before stay valid
    assert len(set(keys.values())) == 3


def test_an_unknown_switch_names_the_key() -> None:
    with pytest.raises(ValueError, match="data.source.supervise"):
        DataSource(supervise="inputs")
