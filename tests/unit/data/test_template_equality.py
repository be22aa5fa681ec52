"""Every family's ids equal to its tokenizer's own ``apply_chat_template``, its supervised
tokens equal to a ``{% generation %}``-marked copy of that template, on 20 varied chats;
the start-up choice and its one log line; one rule for control tokens and for characters
the vocabulary cannot encode."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from helpers.chat_tokenizers import (
    CHATML_TEMPLATE,
    MARKED,
    QWEN25_TEMPLATE,
    with_chat_template,
    write_family_tokenizer,
    write_llama3_tokenizer,
    write_qwen_tokenizer,
)
from odb_lightning.data import (
    IGNORE_INDEX,
    QWEN25_SYSTEM_PROMPT,
    BadSampleError,
    ChatDataset,
    HFTokenizer,
    build_chat_template,
)
from odb_lightning.data.chat_formats import TemplateName


def _chat(*turns: str, system: str | None = None) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    chat = [{"role": roles[k % 2], "content": text} for k, text in enumerate(turns)]
    return ([{"role": "system", "content": system}] if system is not None else []) + chat


CHATS = [
    _chat("Hi", "Hello! How can I help?"),
    _chat("Hi", "Hello!", system="You are terse."),
    _chat("Name a color.", "Blue.", "Another?", "Green.", "And one more?", "Red."),
    _chat("Q1", "A1", "Q2", "A2", system="Answer in one word."),
    _chat("\nLeading newline", "\nAnswer with a leading newline"),
    _chat("\n\n\nThree newlines", "\n\nTwo newlines first\n\n"),
    _chat("", "Empty user turn before me."),
    _chat("Say nothing.", ""),
    _chat("", "", "Both empty above.", "Fine."),
    _chat("Ünïcödé: 你好, 😀, cafe\u0301 — ok?", "Привет! ça va 🎉 日本語"),
    _chat("emoji only", "🎉🎉🎉"),
    _chat(
        "Fix:\n```python\ndef f(x):\n    return x+1\n```", "```python\ndef f(x):\n    return x\n```"
    ),
    _chat("JSON please", '{"a": [1, 2, {"b": null}], "c": "d\\n"}'),
    _chat("  spaces around  ", "  answer with spaces  "),
    _chat("\ttabbed", "\tindented answer\t"),
    _chat("trailing newline\n", "answer\n"),
    _chat("math: 2+2=?", "4", system="\nSystem with a leading newline\n"),
    _chat("a" * 300, "b " * 200),
    _chat("HTML <b>bold</b> & <i>it</i>", "<p>para</p>", system="Use <tags>."),
    _chat("Think?", "<think>\nweighing options\n</think>\n\nDecided."),
]
FAMILIES = ("chatml", "qwen2.5", "qwen3", "llama3", "mistral_v03", "gemma", "phi3")
# What data.source.template=auto settles on for each (hf: the template renders itself).
CHOSEN = {
    "chatml": TemplateName.CHATML,
    "qwen2.5": TemplateName.CHATML,  # with Qwen2.5's default system prompt
    "qwen3": TemplateName.QWEN3,
    "llama3": TemplateName.LLAMA3,
    "mistral_v03": TemplateName.HF,  # v0.3 drops the system turn of training chats
    "gemma": TemplateName.GEMMA,
    "phi3": TemplateName.HF,  # a layout no built-in one shows
}


class FamilyDirs(dict):
    """Each family's tokenizer directory (and ``<family>_marked``), written when first
    asked for: a test pays only for the families it reads."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, key: str) -> Path:
        family, marked = key.removesuffix("_marked"), key.endswith("_marked")
        out = self.root / key
        if marked:
            path = with_chat_template(self[family], out, MARKED[family])
        elif family == "chatml":
            path = write_qwen_tokenizer(out, CHATML_TEMPLATE)
        elif family == "qwen2.5":
            path = with_chat_template(self["chatml"], out, QWEN25_TEMPLATE)
        elif family == "llama3":
            path = write_llama3_tokenizer(out)
        else:
            path = write_family_tokenizer(out, family)
        self[key] = path
        return path


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> FamilyDirs:
    return FamilyDirs(tmp_path_factory.mktemp("families"))


# The families whose layouts test_chat_templates also checks on one chat run their 20
# chats in the slow tier; ChatML (the bundled tokenizer's), Qwen2.5 (its default system
# prompt), Llama 3 (a real vocabulary) and a layout never seen run in the default tier.
TIERED = [
    pytest.param(f, marks=pytest.mark.slow) if f in ("qwen3", "mistral_v03", "gemma") else f
    for f in FAMILIES
]


@pytest.mark.parametrize("family", TIERED)
def test_twenty_chats_equal_the_tokenizers_own_template(
    family_dirs: FamilyDirs, family: str, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer, marked = (
        HFTokenizer(family_dirs[family]),
        HFTokenizer(family_dirs[f"{family}_marked"]),
    )
    with caplog.at_level(logging.INFO, logger="odb_lightning.data.template_choice"):
        template = build_chat_template(tokenizer, "auto")
    assert template.name is CHOSEN[family]
    assert len(caplog.records) == 1  # the choice, said once
    equal_ids = equal_masks = 0
    for chat in CHATS:
        ours = template.tokenize(chat)
        own = tokenizer.backend.apply_chat_template(chat, tokenize=True, return_dict=True)
        reference = marked.backend.apply_chat_template(
            chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert list(reference["input_ids"]) == list(own["input_ids"])  # the marks change no id
        equal_ids += ours.input_ids == list(own["input_ids"])
        supervised = [label != IGNORE_INDEX for label in ours.labels]
        equal_masks += supervised == [bool(m) for m in reference["assistant_masks"]]
        assert all(
            label in (IGNORE_INDEX, t) for t, label in zip(ours.input_ids, ours.labels, strict=True)
        )
    assert (equal_ids, equal_masks) == (len(CHATS), len(CHATS)) == (20, 20)


def test_qwen25_chats_without_a_system_turn_get_its_default_system_prompt(
    family_dirs: FamilyDirs, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = HFTokenizer(family_dirs["qwen2.5"])
    records = [{"id": k, "messages": chat} for k, chat in enumerate(CHATS)]
    with caplog.at_level(logging.INFO, logger="odb_lightning.data.template_choice"):
        dataset = ChatDataset(records, tokenizer, 4096, template="auto")
    assert dataset.template.system_prompt == QWEN25_SYSTEM_PROMPT
    assert f"with its default system prompt {QWEN25_SYSTEM_PROMPT!r}" in caplog.text
    assert f"on {7 + len(CHATS[:16])} probe chats" in caplog.text  # fixed chats + the run's first
    sample = dataset[0]
    own = tokenizer.backend.apply_chat_template(CHATS[0], tokenize=True, return_dict=True)
    assert sample["input_ids"].tolist() == list(own["input_ids"])
    assert QWEN25_SYSTEM_PROMPT in tokenizer.decode(sample["input_ids"].tolist())
    # Asked for chatml by name, the run says in one line what its own template adds.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_chat_template(tokenizer, "chatml")
    assert len(caplog.records) == 1
    assert "set data.source.system_prompt to it" in caplog.text
    assert QWEN25_SYSTEM_PROMPT in caplog.text


def test_mistral_v03_follows_its_own_template_and_says_it_drops_the_system_turn(
    family_dirs: FamilyDirs, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = HFTokenizer(family_dirs["mistral_v03"])
    with caplog.at_level(logging.INFO, logger="odb_lightning.data.template_choice"):
        template = build_chat_template(tokenizer, "auto")
    assert "leaves out the system turn" in caplog.text
    assert "data.source.template=mistral keeps it on the first user turn" in caplog.text
    assert "You are terse." not in template.render(CHATS[1])
    kept = build_chat_template(tokenizer, "mistral")
    assert "You are terse.\n\nHi" in kept.render(CHATS[1])


@pytest.mark.parametrize("family", ["chatml", "llama3", "phi3"])
def test_a_control_token_in_text_trains_nothing_in_every_layout(
    family_dirs: FamilyDirs, family: str
) -> None:
    tokenizer = HFTokenizer(family_dirs[family])
    template = build_chat_template(tokenizer, "auto")
    token = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "phi3": "<|end|>"}[family]
    chat = _chat("Hi", f"fake {token} boundary")
    tokenized = template.tokenize(chat)
    own = tokenizer.backend.apply_chat_template(chat, tokenize=True, return_dict=True)
    assert tokenized.input_ids == list(own["input_ids"])  # the ids stay the template's
    assert tokenized.dropped and set(tokenized.labels) == {IGNORE_INDEX}


def test_a_character_the_vocabulary_cannot_encode_is_named(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hi", "there", "\n"]
    model = models.WordLevel({w: k for k, w in enumerate(words)}, unk_token="<unk>")
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Split("\n", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(tmp_path))
    template = build_chat_template(HFTokenizer(tmp_path), "chatml")
    with pytest.raises(BadSampleError) as info:
        template.tokenize(_chat("hi", "é"))
    assert info.value.field == "messages[1].content"
    assert "'é' (U+00E9), text tokenizer" in info.value.problem
    assert "cannot encode" in info.value.problem and "control token" not in info.value.problem
