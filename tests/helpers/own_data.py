"""A user's own JSON Lines file, as a first try would have it."""

from __future__ import annotations

import json
from pathlib import Path

LONG = " ".join(f"word{k}" for k in range(200))  # far more than max_seq_len=64 tokens


def write_own_jsonl(path: Path, num_short: int, num_long: int) -> list[str]:
    """``num_short`` short and ``num_long`` over-long conversations with string ids, and one
    line that is not JSON (third line); returns the good records' ids."""
    ids = []
    with path.open("w", encoding="utf-8") as out:
        for k in range(num_short + num_long):
            record_id = f"long-{k}" if k >= num_short else f"conv-{k}"
            answer = LONG if k >= num_short else f"answer number {k}"
            messages = [
                {"role": "user", "content": f"question {k}?"},
                {"role": "assistant", "content": answer},
            ]
            out.write(json.dumps({"id": record_id, "messages": messages}) + "\n")
            ids.append(record_id)
            if k == 1:
                out.write('{"id": "broken", "messages": [\n')
    return ids
