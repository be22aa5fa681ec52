"""The records a run read but does not train on, each named: ``skipped_records.jsonl`` in
the run directory.

Two kinds, one JSON object per record, ``{"source", "record", "reason"}``:

- source lines skipped as bad records (``batching.loader.on_bad_sample=skip``): ``record``
  is ``<file>:<line>``, ``reason`` the field and the problem, as the source rejected it;
- training records without a supervised token (no assistant turn, or, where a length pass
  counted them, none left after the template, ``max_seq_len`` and
  ``data.sizes.truncation``, which drops a sample it cannot cut without losing an answer's
  end): ``record`` is the record's own id.

The counts in ``summary.json`` (``skipped_bad_records``, ``unsupervised_samples``) count
the same records; this file names them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)

SKIPPED_RECORDS_FILE = "skipped_records.jsonl"
LOGGED_ENTRIES = 5
"""Records named in the log when there is no run directory to write the file into."""

# A source's rejection message: "record <where>: field '<name>': <problem>"
# (odb_lightning.data.conversation.BadRecordError).
_REJECTED = re.compile(r"^record (?P<record>.+?): (?P<reason>field .*)$", re.DOTALL)

NO_ASSISTANT_TURN = "no assistant turn: nothing to supervise (SFT trains on assistant turns)"
NO_SUPERVISED_TOKEN = (
    "0 supervised tokens after the chat template and data.sizes.max_seq_len: longer than "
    "max_seq_len and dropped by data.sizes.truncation, a control token spelled in its text, "
    "or its assistant turns are empty"
)


def rejected_entries(source: str, rejected: Iterable[str]) -> list[dict[str, Any]]:
    """One entry per line the source rejected (its messages, in file order)."""
    entries = []
    for message in rejected:
        match = _REJECTED.match(message)
        record, reason = (match["record"], match["reason"]) if match else (None, message)
        entries.append({"source": source, "record": record, "reason": reason})
    return entries


def unsupervised_entries(
    source: str, record_ids: Sequence[str | int], *, exact: bool
) -> list[dict[str, Any]]:
    """One entry per training record without a supervised token (``exact``: a length
    pass counted its supervised tokens; else a scan found no assistant turn)."""
    reason = NO_SUPERVISED_TOKEN if exact else NO_ASSISTANT_TURN
    return [{"source": source, "record": record, "reason": reason} for record in record_ids]


def report_skipped_records(
    entries: list[dict[str, Any]], counts: dict[str, int], output_dir: str | Path | None
) -> Path | None:
    """Write ``entries`` to :data:`SKIPPED_RECORDS_FILE` in ``output_dir`` (rank 0; none
    when there is nothing to name or no run directory) and log the counts with the file's
    path. Returns the path written, if any."""
    if not entries or rank_zero_only.rank != 0:
        return None
    what = ", ".join(f"{name}: {count:,}" for name, count in counts.items() if count)
    if output_dir is None:  # no run (odb-preview): the first few are named here
        named = "; ".join(f"{e['record']}: {e['reason']}" for e in entries[:LOGGED_ENTRIES])
        more = (
            f" (and {len(entries) - LOGGED_ENTRIES:,} more)"
            if len(entries) > LOGGED_ENTRIES
            else ""
        )
        log.warning("%s: %s%s", what, named, more)
        return None
    path = Path(output_dir) / SKIPPED_RECORDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry, default=str) + "\n")
    log.warning("%s; each one named in %s", what, path)
    return path


def report_skipped(
    source: str,
    counts: dict[str, int],
    rejected: list[str],
    unsupervised_ids: Sequence[str | int],
    exact: bool,
    output_dir: str | Path | None,
) -> None:
    """Name every source line skipped (``rejected``: the source's messages) and every
    training record without a supervised token (``unsupervised_ids``; ``exact``: counted
    by the length pass) in the run directory's ``skipped_records.jsonl`` (rank 0), and
    log the counts with its path."""
    entries = rejected_entries(source, rejected)
    entries += unsupervised_entries(source, unsupervised_ids, exact=exact)
    report_skipped_records(
        entries,
        {
            "source lines skipped as bad records": counts.get("dropped/bad_record", 0),
            "training records without a supervised token": len(unsupervised_ids),
        },
        output_dir,
    )
