"""ChatML rendering, SFT label masking, truncation and message errors."""

from __future__ import annotations

import pytest

from odb_lightning.data import (
    IGNORE_INDEX,
    QWEN25_SYSTEM_PROMPT,
    BadSampleError,
    ChatTemplate,
    QwenTokenizer,
    Truncation,
    build_chat_template,
    count_loss_tokens,
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "Six, written as 6."},
]


@pytest.fixture(scope="module")
def template(tokenizer: QwenTokenizer) -> ChatTemplate:
    return build_chat_template(tokenizer, "chatml")


def supervised_spans(labels: list[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    previous = IGNORE_INDEX
    for label in labels:
        if label != IGNORE_INDEX:
            if previous == IGNORE_INDEX:
                spans.append([])
            spans[-1].append(label)
        previous = label
    return spans


def test_render_and_ids_agree(template: ChatTemplate) -> None:
    chat = template.tokenize(CONVERSATION)
    text = template.tokenizer.decode(chat.input_ids)
    assert text == template.render(CONVERSATION)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\nSix, written as 6.<|im_end|>\n")
    # 5 messages -> exactly 5 control <|im_start|> and 5 <|im_end|>.
    assert chat.input_ids.count(151644) == 5
    assert chat.input_ids.count(151645) == 5


def test_one_pass_keeps_what_the_tokenizer_merges(template: ChatTemplate) -> None:
    # "assistant\n" then content "\n\nHi": one pass merges the three newlines into one
    # token, as apply_chat_template does (the header and content encoded apart would not).
    chat = template.tokenize(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\n\nHi"}]
    )
    tokenizer = template.tokenizer
    assert (
        chat.input_ids
        == tokenizer.encode_rendered(
            template.render(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\n\nHi"}]
            )
        )[0]
    )
    newlines = tokenizer.encode_text("\n\n\n")
    assert len(newlines) == 1 and newlines[0] in chat.input_ids
    # The merged token overlaps the answer, so it is supervised.
    assert tokenizer.decode(supervised_spans(chat.labels)[0]) == "\n\n\nHi<|im_end|>"


def test_only_assistant_content_and_im_end_are_supervised(template: ChatTemplate) -> None:
    chat = template.tokenize(CONVERSATION)
    assert len(chat.labels) == len(chat.input_ids)
    decode = template.tokenizer.decode
    spans = [decode(span) for span in supervised_spans(chat.labels)]
    assert spans == ["4.<|im_end|>", "Six, written as 6.<|im_end|>"]
    for t, label in enumerate(chat.labels):
        assert label in (IGNORE_INDEX, chat.input_ids[t])
    expected = len(template.tokenizer.encode_text("4.")) + 1
    expected += len(template.tokenizer.encode_text("Six, written as 6.")) + 1
    assert chat.num_loss_tokens == expected == count_loss_tokens(chat.labels)
    assert not chat.truncated


def test_default_system_prompt(template: ChatTemplate) -> None:
    qwen = build_chat_template(template.tokenizer, "chatml", QWEN25_SYSTEM_PROMPT)
    no_system = CONVERSATION[1:]
    assert qwen.render(no_system).startswith(f"<|im_start|>system\n{QWEN25_SYSTEM_PROMPT}")
    assert qwen.render(CONVERSATION) == template.render(CONVERSATION)  # own system wins
    assert template.render(no_system).startswith("<|im_start|>user\n")


@pytest.mark.parametrize("token", ["<|im_end|>", "<|im_start|>", "<|endoftext|>"])
def test_a_conversation_spelling_a_control_token_trains_nothing(
    template: ChatTemplate, token: str
) -> None:
    messages = [*CONVERSATION[:3], {"role": "user", "content": f"say {token} now"}, CONVERSATION[4]]
    chat = template.tokenize(messages)
    assert chat.dropped and chat.num_loss_tokens == 0 and not chat.truncated
    # One pass reads the token as the template would: one more of it among the ids.
    whole = template.tokenize(CONVERSATION)
    token_id = template.tokenizer.encode_rendered(token)[0][0]
    assert chat.input_ids.count(token_id) == whole.input_ids.count(token_id) + 1
    assert chat.input_ids == template.tokenizer.encode_rendered(template.render(messages))[0]


def test_tail_truncation_and_shifted_loss_count(template: ChatTemplate) -> None:
    full = template.tokenize(CONVERSATION)
    first_target = next(t for t, label in enumerate(full.labels) if label != IGNORE_INDEX)
    cut = template.tokenize(CONVERSATION, first_target + 2, Truncation.TAIL)
    assert cut.input_ids == full.input_ids[: first_target + 2]
    assert cut.labels == full.labels[: first_target + 2]
    assert cut.truncated and cut.full_length == full.length and not cut.dropped
    assert cut.num_loss_tokens == 2
    # Nothing supervised left after the cut: dropped (the cut kept, none supervised).
    none_left = template.tokenize(CONVERSATION, first_target, Truncation.TAIL)
    assert none_left.dropped and none_left.length == first_target
    assert none_left.num_loss_tokens == 0 and none_left.input_ids == full.input_ids[:first_target]
    assert none_left.truncated and none_left.full_length == full.length


def test_count_loss_tokens_is_shifted() -> None:
    assert count_loss_tokens([5, -100, 7, 8]) == 2
    assert count_loss_tokens([5, -100]) == 0  # labels[0] is never a target
    assert count_loss_tokens([]) == 0


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "robot", "content": "x"}, "messages[1].role"),
        ({"role": "user", "content": None}, "messages[1].content"),
        ("not a dict", "messages[1]"),
    ],
)
def test_bad_messages_name_the_field(template: ChatTemplate, message, field: str) -> None:
    with pytest.raises(BadSampleError) as info:
        template.tokenize([{"role": "user", "content": "hi"}, message])
    assert info.value.field == field and field in str(info.value)
