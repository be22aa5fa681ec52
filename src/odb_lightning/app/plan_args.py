"""``odb-plan``'s command line: its options, and the batching options, which set fields
of the batching configuration (:data:`KNOB_OPTIONS`): their types, defaults and choices
come from those dataclass fields, and each mode gets the options of its own policy."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

from odb_lightning.app.plan_inputs import SOURCES
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES, Mode
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.policy import BucketedPolicy, SortedPolicy, StandardPolicy
from odb_lightning.data.formats import FORMATS

DEFAULT_BUDGET = 16384


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _synthetic(text: str) -> tuple[float, float, int]:
    parts = text.split(",")
    try:
        mean, cv, n = float(parts[0]), float(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"expected MEAN,CV,N (e.g. 1456,0.54,17545), got {text!r}"
        ) from None
    if len(parts) != 3 or not (mean > 0 and cv >= 0 and n > 0):
        raise argparse.ArgumentTypeError(f"need MEAN > 0, CV >= 0, N > 0, got {text!r}")
    return mean, cv, n


def _modes(text: str) -> list[Mode]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not set(names) <= set(MODES):
        valid = ",".join(MODES)
        raise argparse.ArgumentTypeError(f"modes must be among {valid}, got {text!r}")
    return [MODES[name] for name in names]


@dataclasses.dataclass(frozen=True)
class KnobOption:
    """A command-line option that sets the field ``knob`` of the policies ``policies``."""

    flag: str
    knob: str
    policies: tuple[type, ...]
    help: str
    from_config: bool = False
    """No default of its own: unset, the policy's field default applies (shown so)."""

    def field(self) -> dataclasses.Field:
        return next(f for f in dataclasses.fields(self.policies[0]) if f.name == self.knob)

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        field = self.field()
        default = field.default
        if isinstance(default, bool):
            parser.add_argument(self.flag, dest=self.knob, action="store_true", help=self.help)
            return
        if default is None and "bool" in str(field.type):  # on, off, or where it applies
            parser.add_argument(
                self.flag,
                dest=self.knob,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{self.help} (default: where it applies)",
            )
            return
        choices = [m.value for m in type(default)] if isinstance(default, Enum) else None
        if isinstance(default, tuple):
            parse: Callable[[str], object] = _int_list
        else:
            parse = str if choices else (float if isinstance(default, float) else int)
        shown = f"default: the config's, {getattr(default, 'value', default)}"
        parser.add_argument(
            self.flag,
            dest=self.knob,
            type=parse,
            choices=choices,
            default=None if self.from_config or isinstance(default, tuple) else default,
            help=f"{self.help} ({shown})" if self.from_config else self.help,
        )


KNOB_OPTIONS = (
    KnobOption("--batch-size", "batch_size", (StandardPolicy, SortedPolicy), "standard/sorted"),
    KnobOption("--window", "outstanding_depth", (OnlinePolicy,), "odb window cap D", True),
    KnobOption(
        "--window-budgets",
        "window_budgets",
        (OnlinePolicy,),
        "odb window in token budgets of work (0: D samples)",
        True,
    ),  # fmt: skip
    KnobOption("--dealing", "shard_dealing", (OnlinePolicy,), "shards for --ranks", True),
    KnobOption(
        "--cross-rank",
        "cross_rank_grouping",
        (OnlinePolicy,),
        "--ranks: group the tail, the ramp and uneven rounds across ranks",
    ),
    KnobOption(
        "--pool-below-sync",
        "pool_below_sync",
        (OnlinePolicy,),
        "--cross-rank: pool rounds whose sync efficiency would be below this (1.0: every round)",
    ),
    KnobOption("--buckets", "num_buckets", (BucketedPolicy,), "k for the bucket optimizer"),
    KnobOption("--boundaries", "boundaries", (BucketedPolicy,), "fixed bucket edges, no optimizer"),
    KnobOption("--max-batch-size", "max_batch_size", (BucketedPolicy,), "bucketed batch cap"),
)
"""The batching options: each sets one field of the policies it names, nowhere else."""


def knobs_of(args: argparse.Namespace, policy: type) -> dict[str, Any]:
    """The options given for ``policy``'s fields (``--window-budgets 0``: no work cap)."""
    knobs = {
        option.knob: getattr(args, option.knob)
        for option in KNOB_OPTIONS
        if policy in option.policies and getattr(args, option.knob) is not None
    }
    if knobs.get("window_budgets") == 0:
        knobs["window_budgets"] = None
    return knobs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odb-plan", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths",
        type=Path,
        help="sample lengths: a length cache (lengths-*.arrow), .npy, or text with one int per "
        "sample",
    )
    source.add_argument(
        "--synthetic", type=_synthetic, metavar="MEAN,CV,N",
        help="N lognormal lengths of mean MEAN tokens and coefficient of variation CV",
    )  # fmt: skip
    source.add_argument(
        "--source", choices=SOURCES,
        help="tokenize a data source with the chat template (ultrachat and jsonl need --path)",
    )  # fmt: skip
    source.add_argument(
        "--mixture", nargs="+", metavar="PATH[:WEIGHT]",
        help="a mixture of your files (train.py's data.mixture), each with its weight "
        "(default 1), chosen as training chooses them (--seed, --max-samples caps the mix)",
    )  # fmt: skip
    parser.add_argument(
        "--path",
        help="--source ultrachat: parquet file/dir or hub name; jsonl: your files (JSON "
        "Lines, a JSON array, parquet, a folder or glob, a save_to_disk folder)",
    )
    parser.add_argument(
        "--format", default="auto", choices=["auto", *FORMATS],
        help="--source jsonl: the records' layout (data.source.format; auto: detected)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default="qwen2.5", help="--source: qwen2.5 or a Hugging Face directory"
    )
    parser.add_argument(
        "--template", default="auto", help="--source: chat template (data.source.template)"
    )
    parser.add_argument(
        "--record-cache-dir", metavar="DIR",
        help="--source: convert the records once into a memory-mapped table here and read "
        "them from it (train.py's data.caches.record_dir, default "
        "<project>/.cache/odb_lightning/records, shares it); default: odb_lightning/records "
        "in the datasets cache",
    )  # fmt: skip
    parser.add_argument(
        "--skip-bad-records", action="store_true",
        help="--source jsonl: skip lines that are not a conversation (counted), as "
        "batching.loader.on_bad_sample=skip does in training",
    )  # fmt: skip
    parser.add_argument("--max-seq-len", type=int, help="truncate lengths to this many tokens")
    parser.add_argument("--max-samples", type=int, help="first N samples of --source")
    parser.add_argument(
        "--budget", type=_int_list, action="append", metavar="TOKENS[,TOKENS...]",
        help=f"token budget(s) per step, comma-separated or repeated (default {DEFAULT_BUDGET})",
    )  # fmt: skip
    parser.add_argument(
        "--modes", type=_modes, default=_modes("standard,sorted,bucketed,oracle,odb"),
        metavar="MODE[,MODE...]",
        help="batching modes to plan, among " + ",".join(MODES)
        + " (default standard,sorted,bucketed,oracle,odb)",
    )  # fmt: skip
    parser.add_argument(
        "--ranks", type=int, default=None,
        help="also simulate odb over N ranks: sync efficiency, utilization, steps/oracle",
    )  # fmt: skip
    for option in KNOB_OPTIONS:
        option.add_to(parser)
    parser.add_argument("--seed", type=int, default=BatchingConfig().seed)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return parser
