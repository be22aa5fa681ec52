"""``odb-chat``: the prompt is the run's template up to the answer, a reply ends at the
template's end-of-turn token, and the conversation carries every turn."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from odb_lightning.app.chat import EMPTY_ANSWER, ChatSession, converse, generation_prompt, main
from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.template_choice import build_chat_template


@pytest.fixture(scope="module")
def template():
    return build_chat_template(QwenTokenizer(), "chatml")


class ScriptedModel:
    """Answers each prompt with the next scripted text, then the end-of-turn and junk
    (which generation would not reach); records the prompts and settings it was given."""

    def __init__(self, tokenizer: QwenTokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers, self.calls = tokenizer, list(answers), []

    def generate(self, input_ids: torch.Tensor, **settings: object) -> torch.Tensor:
        self.calls.append(SimpleNamespace(ids=input_ids[0].tolist(), **settings))
        answer = self.tokenizer.encode_text(self.answers.pop(0))
        tail = [settings["eos_token_id"], *self.tokenizer.encode_text(" junk")]
        return torch.tensor([input_ids[0].tolist() + answer + tail])


def test_the_prompt_is_the_template_up_to_the_answer(template) -> None:
    ids, end_of_turn = generation_prompt(template, [{"role": "user", "content": "hi"}])
    tokenizer = template.tokenizer
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode([end_of_turn]) == "<|im_end|>"


def test_replies_end_at_the_end_of_turn_and_the_conversation_carries_them(template) -> None:
    model = ScriptedModel(template.tokenizer, ["Hello there.", "Fine, thanks."])
    session = ChatSession(model, template, max_new_tokens=16)
    assert session.reply("hi") == "Hello there."
    assert session.reply("how are you?") == "Fine, thanks."
    second = template.tokenizer.decode(model.calls[1].ids)
    assert second == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello there.<|im_end|>\n"
        "<|im_start|>user\nhow are you?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert model.calls[0].max_new_tokens == 16 and model.calls[0].do_sample is False


def test_the_terminal_loop_resets_and_ends(template) -> None:
    model = ScriptedModel(template.tokenizer, ["one", "two", ""])
    session = ChatSession(model, template)
    lines, shown = iter(["hi", "/reset", "again", "and?", ""]), []
    assert converse(session, read=lambda _: next(lines), write=shown.append) == 3
    assert shown == ["model> one", "(a new conversation)", "model> two", f"model> {EMPTY_ANSWER}"]
    assert [m["content"] for m in session.messages] == ["again", "two", "and?", ""]


def test_a_tiny_model_answers_within_its_token_limit(template) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=8, intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model, generated = Qwen2ForCausalLM(config).eval(), []
    original = model.generate

    def recorded(**settings: object) -> torch.Tensor:
        output = original(**settings)
        generated.append(output.shape[1] - settings["input_ids"].shape[1])
        return output

    model.generate = recorded
    session = ChatSession(model, template, max_new_tokens=5)
    answer = session.reply("hi")
    assert 1 <= generated[0] <= 5
    assert session.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": answer},
    ]


def test_a_file_that_is_no_checkpoint_is_named(tmp_path: Path, capsys) -> None:
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint")
    assert main([str(path)]) == 2
    assert str(path) in capsys.readouterr().err
