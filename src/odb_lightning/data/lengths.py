"""Length pass: run the real template and tokenizer over a source and report token lengths.

This is the offline pass the length-pass modes and the planner need (and that online
batching avoids); its wall time is part of the report. Over-length conversations:
``drop`` (default) leaves them out and counts them, which is how the ShareGPT
:data:`~odb_lightning.data.synthetic.LENGTH_PROFILES` were measured (``docs/data.md``);
``truncate`` keeps them at ``max_seq_len`` tokens, as
:class:`~odb_lightning.data.ChatDataset` does.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.data.conversation import ChatRecord
from odb_lightning.data.hf_tokenizer import load_tokenizer
from odb_lightning.data.plain_text import tokenize_record
from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.sources import load_source
from odb_lightning.data.sources.table import SourceKind, source_named
from odb_lightning.data.synthetic import LENGTH_PROFILES
from odb_lightning.data.template import ChatTemplate
from odb_lightning.data.template_choice import build_chat_template
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import BadSampleError

if TYPE_CHECKING:
    from odb_lightning.data.record_table import RecordCache

SYNTHETIC_DEFAULT_SAMPLES = 10_000


class OverLength(StrEnum):
    """What the length pass does with conversations longer than ``max_seq_len``."""

    DROP = "drop"
    TRUNCATE = "truncate"


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Summary of a length sample (tokens)."""

    count: int
    mean: float
    cv: float
    minimum: int
    p50: int
    p90: int
    p99: int
    maximum: int

    @classmethod
    def of(cls, lengths: list[int]) -> LengthStats:
        """Summarize ``lengths`` (non-empty); CV uses the population standard deviation."""
        if not lengths:
            raise ValueError("no lengths to summarize")
        ordered = sorted(lengths)
        mean = statistics.fmean(ordered)

        def quantile(q: float) -> int:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        cv = statistics.pstdev(ordered) / mean
        return cls(
            len(ordered),
            mean,
            cv,
            ordered[0],
            quantile(0.5),
            quantile(0.9),
            quantile(0.99),
            ordered[-1],
        )


@dataclass
class LengthReport:
    """Result of a length pass.

    Attributes:
        lengths: Token length per kept sample, in source order.
        counts: Source counts plus ``dropped/over_max_seq_len`` or ``truncated``.
        elapsed_s: Wall time of template + tokenization (not of loading the source).
        num_tokenized: Records tokenized in that time (kept or dropped).
        samples_per_s: Tokenization throughput (0 when nothing was tokenized).
    """

    lengths: list[int]
    counts: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    num_tokenized: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.num_tokenized / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def stats(self) -> LengthStats:
        return LengthStats.of(self.lengths)


def _synthetic_report(
    regime: str, max_seq_len: int, max_samples: int | None, seed: int
) -> LengthReport:
    profile = LENGTH_PROFILES[f"sharegpt_{regime}"]
    num_samples = SYNTHETIC_DEFAULT_SAMPLES if max_samples is None else max_samples
    lengths = lognormal_lengths(num_samples, profile.mean_length, profile.cv, seed, max_seq_len)
    return LengthReport(lengths, Counter(read=num_samples, kept=num_samples))


def _tokenized_lengths(
    records: Sequence[ChatRecord],
    template: ChatTemplate,
    over_length: OverLength,
    max_seq_len: int,
    description: str,
    progress: bool,
) -> LengthReport:
    from rich.console import Console
    from rich.progress import Progress

    report = LengthReport([])
    start = time.perf_counter()
    with Progress(console=Console(stderr=True), transient=True, disable=not progress) as bar:
        task = bar.add_task(description, total=len(records))
        for record in records:
            try:
                length = tokenize_record(template, record["messages"]).full_length
            except BadSampleError:  # e.g. a control token spelled in its text
                report.counts["dropped/bad_sample"] += 1
                bar.advance(task)
                continue
            if length <= max_seq_len:
                report.lengths.append(length)
            elif over_length is OverLength.TRUNCATE:
                report.lengths.append(max_seq_len)
                report.counts["truncated"] += 1
            else:
                report.counts["dropped/over_max_seq_len"] += 1
            bar.advance(task)
    report.elapsed_s = time.perf_counter() - start
    report.num_tokenized = len(records)
    return report


def measure_source(
    name: str,
    *,
    max_seq_len: int = 4096,
    tokenizer: ChatTokenizer | str | None = None,
    system_prompt: str | None = None,
    over_length: OverLength | str = OverLength.DROP,
    progress: bool = True,
    template: str = "auto",
    record_cache: RecordCache | None = None,
    **arguments: Any,
) -> LengthReport:
    """Token lengths of a source after the chat template, with counts and timing.

    Args:
        name: A text source of the source table; ``synthetic`` draws lognormal lengths
            (``regime`` picks the ``sharegpt_<regime>`` profile, ``max_samples`` the
            count, default 10,000, ``seed`` the draw).
        max_seq_len: Length limit, applied per ``over_length`` (see the module docstring).
        tokenizer: Defaults to the Qwen2.5 BPE; a string is a name or directory for
            :func:`~odb_lightning.data.hf_tokenizer.load_tokenizer`.
        system_prompt: Default system prompt (none by default, as for the length profiles).
        template: The chat template (``data.source.template``; ``auto`` reads the tokenizer's).
        progress: Show a progress bar on stderr.
        record_cache: Read the records from a memory-mapped record table there (converted
            once), not into memory (:func:`~odb_lightning.data.sources.load_source`).
        **arguments: What the source is asked for, as
            :func:`~odb_lightning.data.sources.load_source` takes it: ``path``,
            ``regime``, ``max_samples``, ``seed``, ``on_bad_record`` (``raise`` at a bad
            record, or ``skip`` it, counted under ``dropped/bad_record``), ``format``,
            ``mapping``.
    """
    regime = arguments.get("regime", "whole")
    if source_named(name, (SourceKind.CHAT, SourceKind.TOKENS)).kind is SourceKind.TOKENS:
        max_samples, seed = arguments.get("max_samples"), arguments.get("seed", 0)
        return _synthetic_report(regime, max_seq_len, max_samples, seed)
    source = load_source(name, record_cache=record_cache, **arguments)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    chat_template = build_chat_template(tokenizer or QwenTokenizer(), template, system_prompt)
    report = _tokenized_lengths(
        source.records,
        chat_template,
        OverLength(over_length),
        max_seq_len,
        f"lengths {source.name}/{regime}",
        progress,
    )
    report.counts.update(source.counts)
    return report


def source_lengths(name: str, **arguments: Any) -> list[int]:
    """Token lengths of a source: :func:`measure_source`'s (same arguments) without its
    counts and timing; what the studies plan over."""
    return measure_source(name, **arguments).lengths
