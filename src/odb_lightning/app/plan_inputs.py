"""The lengths ``odb-plan`` plans over: a file, a lognormal profile or a data source."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from odb_lightning.core.plans import validate_lengths
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.data.sources.table import SourceKind, source_named, source_names

SOURCES = source_names(SourceKind.CHAT, SourceKind.TOKENS)
"""``--source`` names: the text sources of the source table (its module loads without
the data stack, so ``--help`` stays fast)."""


class PlanCliError(Exception):
    """Bad input the user can fix; printed without a traceback."""


_TRAIN_KEYS = (
    ("set data.source.template to", "set --template to"),
    ("(data.source.template=auto picks it)", "(--template auto picks it)"),
    ("(tokenizer=hf)", "(--tokenizer <a Hugging Face directory>)"),
    ("data.source.template=", "--template "),
    ("data.source.template", "--template"),
)
"""What the data layer's messages tell a ``train.py`` user to set, and the same said in
this command's flags."""


def in_flags(message: str) -> str:
    """``message`` with the ``train.py`` keys it names (``data.source.template``) said as the
    flags of ``odb-plan`` (``--template``)."""
    for key, flag in _TRAIN_KEYS:
        message = message.replace(key, flag)
    return message


def read_lengths_file(path: Path) -> list[int]:
    """Lengths from a length cache a training run wrote (``lengths-*.arrow``, its
    ``length`` column), a ``.npy`` array (integer dtype) or whitespace-separated
    integers."""
    if not path.is_file():
        raise PlanCliError(f"--lengths: no such file {path}")
    if path.suffix == ".arrow":
        from odb_lightning.data.length_file import CorruptCacheError, read_length_columns

        try:
            return read_length_columns(path)[1].tolist()
        except CorruptCacheError as error:
            raise PlanCliError(f"--lengths: {error}") from None
    if path.suffix == ".npy":
        import numpy as np

        array = np.load(path, allow_pickle=False)
        if not np.issubdtype(array.dtype, np.integer):
            raise PlanCliError(f"--lengths: {path} has dtype {array.dtype}, expected integers")
        return [int(v) for v in array.reshape(-1)]
    lengths = []
    for position, token in enumerate(path.read_text().split()):
        try:
            lengths.append(int(token))
        except ValueError:
            raise PlanCliError(
                f"--lengths: {path} entry {position} is not an integer: {token!r}"
            ) from None
    return lengths


def mixture_part(text: str) -> tuple[str, float]:
    """``PATH[:WEIGHT]`` of ``--mixture``: the path and its weight (default 1)."""
    path, _, weight = text.rpartition(":")
    try:
        value = float(weight)
    except ValueError:
        return text, 1.0
    if not path or value <= 0:
        raise PlanCliError(f"--mixture {text}: the weight after ':' must be a number > 0")
    return path, value


def mixture_lengths(args: argparse.Namespace) -> tuple[list[int], str]:
    """The lengths of a mixture of the user's files, each part's records chosen as
    ``data.mixture`` chooses them (:mod:`odb_lightning.data.mixture`)."""
    from odb_lightning.data.lengths import measure_source
    from odb_lightning.data.mixture import chosen_records, part_counts
    from odb_lightning.data.record_table import RecordCache, default_record_cache_dir

    parts = [mixture_part(text) for text in args.mixture]
    cache = RecordCache(args.record_cache_dir or default_record_cache_dir())
    max_seq_len = args.max_seq_len or 4096
    measured = []
    for path, _ in parts:
        try:
            report = measure_source(
                "jsonl", path=path, record_cache=cache, max_seq_len=max_seq_len,
                over_length="truncate", tokenizer=args.tokenizer, template=args.template,
                format=args.format, on_bad_record="skip" if args.skip_bad_records else "raise",
            )  # fmt: skip
        except (OSError, ValueError) as error:
            raise PlanCliError(f"--mixture {path}: {in_flags(str(error))}") from None
        measured.append(list(report.lengths))
    available = [len(m) for m in measured]
    counts = part_counts([w for _, w in parts], [None] * len(parts), available, args.max_samples)
    lengths = []
    for k, (part, n) in enumerate(zip(measured, counts, strict=True)):
        if n:
            lengths.extend(part[i] for i in chosen_records(len(part), n, args.seed, k))
    shares = ", ".join(f"{p}: {n}" for (p, _), n in zip(parts, counts, strict=True))
    return lengths, f"mixture ({shares}; max_seq_len={max_seq_len})"


def load_lengths(args: argparse.Namespace) -> tuple[list[int], str]:
    """The lengths the command plans over, and a description of where they came from.

    ``--max-seq-len`` truncates file lengths and synthetic draws, and is handed to
    ``--source`` (default 4096 there).
    """
    if args.lengths is not None:
        lengths, origin = read_lengths_file(args.lengths), str(args.lengths)
    elif args.synthetic is not None:
        mean, cv, n = args.synthetic
        lengths = lognormal_lengths(n, mean, cv, args.seed, max_len=args.max_seq_len)
        origin = f"lognormal(mean={mean:g}, cv={cv:g}, n={n}, seed={args.seed})"
    elif getattr(args, "mixture", None):
        lengths, origin = mixture_lengths(args)
    else:
        try:
            from odb_lightning.data.lengths import measure_source
        except ImportError as error:
            raise PlanCliError(
                f"--source needs the data layer (odb_lightning.data.lengths): {error}"
            ) from error
        max_seq_len = args.max_seq_len or 4096
        if source_named(args.source).needs_path and args.path is None:
            raise PlanCliError(f"--source {args.source} needs --path (the data to tokenize)")
        from odb_lightning.data.record_table import RecordCache, default_record_cache_dir

        cache = RecordCache(args.record_cache_dir or default_record_cache_dir())
        try:
            # What the source is asked for, as train.py's data.source and data.sizes ask.
            asked = {"path": args.path, "max_samples": args.max_samples, "format": args.format}
            asked["on_bad_record"] = "skip" if args.skip_bad_records else "raise"
            tokens = {"tokenizer": args.tokenizer, "template": args.template}
            report = measure_source(
                args.source, record_cache=cache, max_seq_len=max_seq_len,
                over_length="truncate", **tokens, **asked,  # truncated as training does
            )  # fmt: skip
        except (OSError, ValueError) as error:  # a missing file, a bad record or template
            raise PlanCliError(f"--source {args.source}: {in_flags(str(error))}") from None
        lengths = list(report.lengths)
        origin = f"source {args.source} (max_seq_len={max_seq_len})"
        if report.counts.get("dropped/bad_record"):
            origin += f", {report.counts['dropped/bad_record']} bad records skipped"
    if not lengths:
        raise PlanCliError(f"no lengths in {origin}")
    try:
        validate_lengths(lengths)
    except ValueError as error:
        raise PlanCliError(f"{origin}: {error}") from None
    if args.max_seq_len is not None:
        lengths = [min(n, args.max_seq_len) for n in lengths]
    return lengths, origin


def describe(lengths: list[int], origin: str) -> dict[str, Any]:
    mean = statistics.fmean(lengths)
    return {
        "origin": origin,
        "n": len(lengths),
        "mean": mean,
        "cv": statistics.pstdev(lengths) / mean,
        "min": min(lengths),
        "max": max(lengths),
    }
