"""``odb-chat``: talk to a trained model in the terminal, through the run's chat template.

``odb-chat CHECKPOINT [--max-new-tokens N] [--temperature T] [--system TEXT]`` rebuilds the
model of a training checkpoint (a ``.ckpt`` file or an FSDP2 checkpoint directory, as
``odb-export`` reads it; LoRA adapters on their base) and the run's tokenizer and chat
template from the config saved in it (``tokenizer``, ``data.source.template``,
``system_prompt``, ``think_block``), then reads a line at a time: each reply is generated
from the whole conversation so far, rendered as training rendered it, and ends at the
template's end-of-turn token. ``/reset`` starts a new conversation; an empty line, EOF or
``/exit`` ends. ``token_id_fold`` stand-ins (``debug=smoke``'s random init) are refused:
their vocabulary is the fold, not the tokenizer's.

The prompt is the conversation with an empty assistant turn, cut before that turn's
supervised tokens: exactly the context a trained answer followed, and the first of those
tokens is the end-of-turn token generation stops at.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from odb_lightning.sample import IGNORE_INDEX

PROMPT, REPLY = "you> ", "model> "
"""What the terminal shows before each turn."""
EMPTY_ANSWER = "(an empty answer: the model ended its turn at once)"
"""Shown for a reply of no text (a model trained little predicts the end-of-turn first)."""


def generation_prompt(template: Any, messages: Sequence[dict[str, str]]) -> tuple[list[int], int]:
    """The ids that precede the answer to ``messages`` (their last turn the user's) under
    ``template``, and the end-of-turn id that closes an answer.

    Raises:
        ValueError: The template supervises nothing of an empty answer (no end-of-turn).
    """
    chat = template.tokenize([*messages, {"role": "assistant", "content": ""}])
    labels = list(chat.labels)
    start = len(labels)
    while start > 0 and labels[start - 1] == IGNORE_INDEX:
        start -= 1  # past the unsupervised tail (a newline after the end-of-turn)
    end = start
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    if end == 0:
        raise ValueError("the chat template supervises no end-of-turn token of an answer")
    # The answer's supervised tokens: an empty think block maybe, then the end-of-turn.
    return list(chat.input_ids[:start]), int(chat.input_ids[end - 1])


class ChatSession:
    """A conversation with ``model`` under ``template``.

    Args:
        model: A ``transformers`` causal LM (or a ``peft`` model over one).
        template: The run's chat template
            (:func:`~odb_lightning.data.template_choice.build_chat_template`).
        max_new_tokens: Longest reply.
        temperature: 0: greedy; else sampled at this temperature.
    """

    def __init__(
        self, model: Any, template: Any, max_new_tokens: int = 256, temperature: float = 0.0
    ) -> None:
        self.model, self.template = model, template
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.messages: list[dict[str, str]] = []

    def reply(self, text: str) -> str:
        """The model's answer to ``text``, added to the conversation with it."""
        import torch

        self.messages.append({"role": "user", "content": text})
        ids, end_of_turn = generation_prompt(self.template, self.messages)
        sampled = self.temperature > 0
        with torch.no_grad():
            output = self.model.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=self.max_new_tokens,
                do_sample=sampled,
                temperature=self.temperature if sampled else None,
                top_p=None,
                top_k=None,
                eos_token_id=end_of_turn,
                pad_token_id=self.template.tokenizer.pad_id,
            )
        new = output[0, len(ids) :].tolist()
        if end_of_turn in new:
            new = new[: new.index(end_of_turn)]
        answer = self.template.tokenizer.decode(new).strip()
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def reset(self) -> None:
        self.messages = []


def load_session(checkpoint: Path, system: str | None, **settings: Any) -> ChatSession:
    """The model, tokenizer and chat template of the run that wrote ``checkpoint``.

    Raises:
        ExportError: The checkpoint is no training checkpoint, a ``token_id_fold``
            stand-in, or records no run config (no tokenizer to talk with).
    """
    from odb_lightning.app.export import ExportError, load_module, load_run_tokenizer
    from odb_lightning.app.run_config import saved_run_config
    from odb_lightning.data.template_choice import build_chat_template

    module = load_module(checkpoint)
    tokenizer = load_run_tokenizer(checkpoint)
    if tokenizer is None:
        raise ExportError(
            f"{checkpoint} records no run config, so neither its tokenizer nor its chat "
            "template is known: export it (odb-export) and load it with transformers"
        )
    source = ((saved_run_config(checkpoint) or {}).get("resolved") or {}).get("data", {})
    source = source.get("source") or {}
    template = build_chat_template(
        tokenizer,
        source.get("template", "auto"),
        system if system is not None else source.get("system_prompt"),
        source.get("think_block", "generation"),
    )
    model = module.model.eval()
    return ChatSession(model, template, **settings)


def converse(
    session: ChatSession, read: Callable[[str], str] = input, write: Callable[[str], Any] = print
) -> int:
    """The terminal loop: a reply to every line, until an empty line, EOF or ``/exit``;
    ``/reset`` starts over. Returns the replies given."""
    replies = 0
    while True:
        try:
            line = read(PROMPT).strip()
        except EOFError:
            return replies
        if line in ("", "/exit"):
            return replies
        if line == "/reset":
            session.reset()
            write("(a new conversation)")
            continue
        write(REPLY + (session.reply(line) or EMPTY_ANSWER))
        replies += 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="odb-chat",
        description="Talk to a trained model in the terminal, with its run's chat template.",
        epilog="/reset starts a new conversation; an empty line or /exit ends",
    )
    parser.add_argument(
        "checkpoint", type=Path, help="a Lightning .ckpt file, or an FSDP2 checkpoint directory"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="longest reply")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy (default); else sampled"
    )
    parser.add_argument(
        "--system", help="the system prompt (default: the run's data.source.system_prompt)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``odb-chat``; returns the exit status."""
    from odb_lightning.app.checkpoints import NotACheckpointError
    from odb_lightning.app.export import ExportError

    args = build_parser().parse_args(argv)
    if args.max_new_tokens < 1 or args.temperature < 0:
        print("odb-chat: --max-new-tokens must be >= 1 and --temperature >= 0", file=sys.stderr)
        return 2
    try:
        session = load_session(
            args.checkpoint, args.system,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        )  # fmt: skip
    except (ExportError, NotACheckpointError, ValueError) as error:
        print(f"odb-chat: error: {error}", file=sys.stderr)
        return 2
    print(f"odb-chat: {args.checkpoint} with the {session.template.name.value} template; "
          "/reset starts over, an empty line ends")  # fmt: skip
    converse(session)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
