"""``odb-preview``: the training samples as the model gets them, supervised tokens marked.

``odb-preview [--num N] [--ids ID,ID] [--plain] [train.py overrides ...]`` composes
``conf/train.yaml`` with the same overrides ``train.py`` takes (``data=jsonl
data.source.path=my_chats.jsonl``, ``tokenizer=hf ...``, ``debug=smoke``), builds only the
tokenizer and the data module (:func:`~odb_lightning.app.components.build_data`: no model,
no trainer), and prints N training samples (default 3; ``--ids``: those records) after the
whole pipeline: the chat template, truncation to ``data.sizes.max_seq_len`` and the
augmentation of epoch 0. Each sample shows its record id, its length, its supervised
tokens (the loss's denominator: supervised positions after the causal shift) and its
text, the tokens that carry a label marked: coloured on a terminal, between ``[[`` and
``]]`` otherwise (or with ``--plain``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

log = logging.getLogger(__name__)

OPEN, CLOSE = "[[", "]]"
"""What surrounds a supervised span in plain output."""
SUPERVISED_STYLE = "bold green"
CONTEXT_STYLE = "dim"


class PreviewError(Exception):
    """Bad input the user can fix; printed without a traceback."""


def config_dir() -> Path:
    """``conf/`` of the project: beside the package's source tree (the repository this
    package is installed from), else in the working directory."""
    for candidate in (Path(__file__).resolve().parents[3] / "conf", Path.cwd() / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise PreviewError(
        "no conf/train.yaml beside the odb_lightning sources or in the working directory: "
        "run odb-preview from the project's directory (the one with train.py)"
    )


def compose_train_config(overrides: Sequence[str], stream_as_table: bool = True) -> Any:
    """``conf/train.yaml`` with ``overrides``, composed as ``train.py`` composes it; paths
    under the working directory, as ``train.py``'s are. With ``stream_as_table``,
    streaming is read as a record table (the same records, template and truncation; a
    stream has no random access)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import open_dict

    from odb_lightning.app.config_store import prepare_composition

    prepare_composition()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    except HydraException as error:
        raise PreviewError(f"overrides {' '.join(overrides)}: {error}") from None
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.root_dir = os.getcwd()
        cfg.paths.output_dir = os.getcwd()  # nothing is written there
        if stream_as_table and cfg.data.get("streaming"):
            cfg.data.streaming = False
    return cfg


@dataclass(frozen=True)
class PreviewSample:
    """One training sample as the model gets it.

    Attributes:
        index: Its dataset index.
        record_id: The record's own id.
        split: ``train`` or ``val`` (held out for validation).
        spans: The sample's text in runs of tokens: ``(text, supervised)``, supervised where
            the token carries a label.
        length: Tokens (after truncation).
        loss_tokens: Supervised positions after the causal shift.
        truncated_from: Its length before truncation, ``None`` if it was not cut.
    """

    index: int
    record_id: str | int
    split: str
    spans: list[tuple[str, bool]]
    length: int
    loss_tokens: int
    truncated_from: int | None


def _runs(labels: Sequence[int]) -> Iterator[tuple[int, int, bool]]:
    """``(start, end, supervised)`` of each run of positions with or without a label."""
    start = 0
    for position in range(1, len(labels) + 1):
        if position == len(labels) or (labels[position] != -100) != (labels[start] != -100):
            yield start, position, labels[start] != -100
            start = position


def text_of(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> text`` with ``tokenizer``: an image's placeholder tokens (which a text
    tokenizer may not decode) by name, a run of one as ``<|image_pad|>×N``; an id the
    tokenizer cannot decode as ``<id N>``."""
    from odb_lightning.data.tokenizer import IMAGE_PAD, VISION_END, VISION_START, SpecialTokens

    names: dict[int, str] = {}
    if isinstance(tokenizer, SpecialTokens):
        for token in (VISION_START, IMAGE_PAD, VISION_END):
            try:
                names[tokenizer.special_token_id(token)] = token
            except ValueError:
                continue

    def decode(ids: list[int]) -> str:
        try:
            return tokenizer.decode(ids)
        except (KeyError, ValueError):
            return "".join(tokenizer_text(i) for i in ids)

    def tokenizer_text(token: int) -> str:
        try:
            return tokenizer.decode([token])
        except (KeyError, ValueError):
            return f"<id {token}>"

    def text(ids: list[int]) -> str:
        parts, plain = [], []
        for token, run in groupby(ids):
            count = len(list(run))
            if token not in names:
                plain += [token] * count
                continue
            if plain:
                parts.append(decode(plain))
                plain = []
            parts.append(names[token] + (f"×{count}" if count > 1 else ""))
        if plain:
            parts.append(decode(plain))
        return "".join(parts)

    return text


def preview_sample(datamodule: Any, index: int, split: str) -> PreviewSample:
    """The sample at dataset ``index`` of ``datamodule`` (after its ``setup``)."""
    from odb_lightning.sample import TRUNCATED_FROM, count_loss_tokens

    sample = datamodule.dataset[index]
    input_ids = sample["input_ids"].tolist()
    labels = sample["labels"].tolist()
    decode = text_of(datamodule.tokenizer)
    spans = [(decode(input_ids[a:b]), supervised) for a, b, supervised in _runs(labels)]
    truncated = sample.get(TRUNCATED_FROM)
    return PreviewSample(
        index=index,
        record_id=datamodule.record_ids([index])[0],
        split=split,
        spans=spans,
        length=len(input_ids),
        loss_tokens=count_loss_tokens(labels),
        truncated_from=None if truncated is None else int(truncated),
    )


def chosen_indices(datamodule: Any, num: int, ids: Sequence[str] | None) -> list[tuple[int, str]]:
    """``(dataset index, split)`` of the samples to show: the first ``num`` training
    samples, or the records whose id is in ``ids`` (compared as text), in ``ids``' order."""
    train = list(datamodule.train_indices)
    if ids is None:
        return [(index, "train") for index in train[:num]]
    in_train = set(train)
    wanted = {str(i): n for n, i in enumerate(ids)}
    found: dict[str, int] = {}
    for index in range(len(datamodule.dataset)):
        record_id = str(datamodule.record_ids([index])[0])
        if record_id in wanted and record_id not in found:
            found[record_id] = index
            if len(found) == len(wanted):
                break
    missing = [i for i in ids if str(i) not in found]
    if missing:
        raise PreviewError(
            f"--ids: no record with id {', '.join(map(repr, missing))} among the "
            f"{len(datamodule.dataset):,} records read (data.sizes.max_samples and "
            "batching.loader.on_bad_sample decide which are read)"
        )
    return [(found[str(i)], "train" if found[str(i)] in in_train else "val") for i in ids]


def header(sample: PreviewSample, position: int, count: int) -> str:
    cut = f", cut from {sample.truncated_from:,}" if sample.truncated_from is not None else ""
    held = " (held out for validation)" if sample.split == "val" else ""
    return (
        f"sample {position}/{count}: id {sample.record_id!r}, index {sample.index}{held}: "
        f"{sample.length:,} tokens{cut}, {sample.loss_tokens:,} supervised"
    )


def plain_text(sample: PreviewSample) -> str:
    """The sample's text with each supervised span between ``[[`` and ``]]``."""
    return "".join(f"{OPEN}{text}{CLOSE}" if on else text for text, on in sample.spans)


def rich_text(sample: PreviewSample) -> Text:
    text = Text()
    for part, on in sample.spans:
        text.append(part, style=SUPERVISED_STYLE if on else CONTEXT_STYLE)
    return text


def render(samples: Sequence[PreviewSample], console: Console, *, plain: bool) -> None:
    for position, sample in enumerate(samples, start=1):
        title = header(sample, position, len(samples))
        if plain:
            console.out(f"--- {title}", highlight=False)
            console.out(plain_text(sample), highlight=False)
        else:
            console.rule(title, style="cyan")
            console.print(rich_text(sample), highlight=False, markup=False)
    legend = (
        f"supervised tokens (those with a label) are between {OPEN} and {CLOSE}"
        if plain
        else "supervised tokens (those with a label) in green, context dimmed"
    )
    console.out(legend, highlight=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="odb-preview",
        description="Show training samples after the chat template, truncation and "
        "augmentation (epoch 0), supervised tokens marked. Takes train.py's overrides.",
    )
    parser.add_argument("--num", type=int, default=3, help="samples to show (default 3)")
    parser.add_argument(
        "--ids", type=lambda text: [i for i in text.split(",") if i], metavar="ID,ID",
        help="show the records with these ids (comma-separated) instead",
    )  # fmt: skip
    parser.add_argument(
        "--plain", action="store_true",
        help=f"no colour: supervised spans between {OPEN} and {CLOSE} (the default off a "
        "terminal)",
    )  # fmt: skip
    parser.add_argument(
        "overrides", nargs="*", help="train.py overrides, e.g. data=jsonl data.source.path=my.jsonl"
    )
    return parser


def preview(
    overrides: Sequence[str], num: int = 3, ids: Sequence[str] | None = None
) -> list[PreviewSample]:
    """The samples :func:`main` shows, read from the config ``overrides`` compose."""
    from odb_lightning.app.components import build_data, launched_accelerator
    from odb_lightning.app.validation import validate_config

    cfg = compose_train_config(overrides)
    validate_config(cfg)
    parts = build_data(cfg, world_size=1, device=launched_accelerator(cfg.trainer))
    datamodule = parts.datamodule
    datamodule.setup("fit")
    return [preview_sample(datamodule, i, s) for i, s in chosen_indices(datamodule, num, ids)]


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.num < 1:
        print("odb-preview: --num must be >= 1", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from odb_lightning.app.run_log import is_user_error

    try:
        samples = preview(args.overrides, args.num, args.ids)
    except Exception as error:
        if isinstance(error, (PreviewError, FileNotFoundError)) or is_user_error(error):
            print(f"odb-preview: {type(error).__name__}: {error}", file=sys.stderr)
            return 2
        raise
    console = console or Console()
    render(samples, console, plain=args.plain or not console.is_terminal)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
