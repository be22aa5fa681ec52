"""A chat JSON Lines file whose token lengths follow the bucketed-shuffle case study.

Each line is ``{"id": "cs-0000000", "messages": [{"role": "user", ...}, {"role":
"assistant", ...}, ...]}``, the schema of ``data=jsonl``. Record ``i``'s length under the
default tokenizer and template (Qwen2.5 BPE, ChatML, no system prompt) is exactly the
``i``-th draw of :data:`~odb_lightning.core.profiles.CASE_STUDY_LENGTHS` (seeded), times
``--length-scale``: the text is made of words that are one token each, with or without
a leading space, so a message of ``w`` words is ``w`` tokens, and the template's own
tokens per conversation are measured once per number of exchanges.

Full lengths (the default, what ``experiment=casestudy_odb`` models) average 2,142
tokens, about 10 KB of text per record: 1M records would be ~10 GB and hours of
tokenization on 2 cores. The scale study therefore writes ``--length-scale 0.125``
(mean 268 tokens, about 1.3 KB per line, 1.3 GB at 1M records)::

    python -m experiments.scale_data.generate --records 100000 --length-scale 0.125 \\
        --out data/casestudy_100k.jsonl

Targets shorter than the template's minimum (a one-word user turn and a one-word reply)
are raised to it; the summary on stderr counts them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from odb_lightning.core.order import make_rng
from odb_lightning.core.profiles import CASE_STUDY_LENGTHS
from odb_lightning.data import QwenTokenizer
from odb_lightning.data.template import ChatTemplate
from odb_lightning.data.template_choice import build_chat_template
from odb_lightning.data.tokenizer import ChatTokenizer

LONGEST = 8191  # the profile's longest sample; the case study's last bucket edge is 8,192
POOL_WORDS = 1 << 20  # words of the text pool messages are cut from (> any message)
MAX_EXCHANGES = 3
USER_SHARE = (0.1, 0.5)  # a user turn's share of its exchange's words, drawn uniformly
# Common words; those that are not one token with and without a leading space are dropped.
WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "they", "you", "were", "her", "she", "there", "one", "all", "we", "their", "been", "has",
    "when", "who", "will", "more", "if", "no", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "time", "could",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before",
    "must", "through", "back", "years", "where", "much", "your", "way", "well", "down",
    "should", "because", "each", "just", "those", "people", "how", "too", "little", "state",
    "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get",
    "here", "between", "both", "life", "being", "under", "never", "day", "same", "another",
    "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since",
    "against", "go", "came", "right", "used", "take", "three",
)  # fmt: skip


def one_token_words(tokenizer: ChatTokenizer) -> list[str]:
    """The :data:`WORDS` that ``tokenizer`` encodes as one token, alone and after a space
    (a message's first word has no space before it)."""
    encode = tokenizer.encode_text
    words = [w for w in WORDS if len(encode(w)) == 1 and len(encode(" " + w)) == 1]
    if len(words) < 16:
        raise RuntimeError(f"only {len(words)} one-token words for this tokenizer: {words}")
    return words


def template_tokens(template: ChatTemplate, exchanges: int) -> int:
    """Tokens the template adds to a conversation of ``exchanges`` user/assistant pairs."""
    empty = [
        {"role": role, "content": ""} for _ in range(exchanges) for role in ("user", "assistant")
    ]
    return template.tokenize(empty).full_length


@dataclass(frozen=True)
class TextPool:
    """One long text of random one-token words; a message of ``w`` words is a slice."""

    text: str
    starts: list[int]  # character offset of word k's leading space; starts[-1] = len(text)

    @classmethod
    def of(cls, words: list[str], seed: int) -> TextPool:
        rng = make_rng(seed, "casestudy-text")
        chosen = rng.choices(words, k=POOL_WORDS)
        starts, offset = [], 0
        for word in chosen:
            starts.append(offset)
            offset += 1 + len(word)
        starts.append(offset)
        return cls("".join(" " + w for w in chosen), starts)

    def words(self, first: int, count: int) -> str:
        """``count`` words from word ``first`` on, without the leading space."""
        return self.text[self.starts[first] + 1 : self.starts[first + count]]


def conversation(target: int, pool: TextPool, overhead: list[int], rng) -> list[dict[str, str]]:
    """A conversation of exactly ``target`` tokens (at least ``overhead[1] + 2``)."""
    exchanges = rng.choice((1, 1, 1, 2, 2, 3))
    while exchanges > 1 and target < overhead[exchanges] + 2 * exchanges:
        exchanges -= 1
    content = target - overhead[exchanges]  # words to spread over 2 * exchanges messages
    per_exchange = [content // exchanges + (k < content % exchanges) for k in range(exchanges)]
    messages = []
    for words in per_exchange:
        user = min(words - 1, max(1, round(words * rng.uniform(*USER_SHARE))))
        for role, count in (("user", user), ("assistant", words - user)):
            first = rng.randrange(POOL_WORDS - count)
            messages.append({"role": role, "content": pool.words(first, count)})
    return messages


def target_lengths(num_records: int, length_scale: float, seed: int, shortest: int) -> list[int]:
    """The profile's draws for the file, at the scale, at most the scaled longest sample
    (never below ``shortest``, which the records are then raised to)."""
    longest = max(shortest, round(LONGEST * length_scale))
    return CASE_STUDY_LENGTHS.lengths(num_records, seed, max_len=longest, scale=length_scale)


def shortest_conversation(tokenizer: ChatTokenizer) -> int:
    """Tokens of the shortest record: one exchange of one word each."""
    return template_tokens(build_chat_template(tokenizer, "auto"), 1) + 2


def records(
    num_records: int, length_scale: float, seed: int, tokenizer: ChatTokenizer
) -> Iterator[tuple[dict, int, bool]]:
    """``(record, token length, raised)`` for every record, in order (``raised``: the
    profile's target was below the template's minimum). The template is the default
    run's: ``data.source.template=auto``, no system prompt."""
    template = build_chat_template(tokenizer, "auto")
    overhead = [0, *(template_tokens(template, k) for k in range(1, MAX_EXCHANGES + 1))]
    shortest = overhead[1] + 2
    pool = TextPool.of(one_token_words(tokenizer), seed)
    rng = make_rng(seed, "casestudy-turns")
    for index, target in enumerate(target_lengths(num_records, length_scale, seed, shortest)):
        length = max(shortest, target)
        messages = conversation(length, pool, overhead, rng)
        yield {"id": f"cs-{index:07d}", "messages": messages}, length, target < shortest


def write_jsonl(
    path: Path, num_records: int, length_scale: float = 1.0, seed: int = 0
) -> dict[str, float | int]:
    """Write the file; returns what it holds (records, bytes, tokens, seconds)."""
    started = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = raised = 0
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as out:
        for record, length, was_raised in records(num_records, length_scale, seed, QwenTokenizer()):
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
            tokens += length
            raised += was_raised
    partial.replace(path)  # a killed run leaves no file that looks complete
    return {
        "records": num_records,
        "bytes": path.stat().st_size,
        "tokens": tokens,
        "mean_tokens": tokens / max(1, num_records),
        "raised_to_minimum": raised,
        "length_scale": length_scale,
        "seed": seed,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, required=True, help="lines to write")
    parser.add_argument("--out", type=Path, required=True, help="the .jsonl file")
    parser.add_argument(
        "--length-scale", type=float, default=1.0,
        help="multiply every length by this (default 1: the case study's; the study's 0.125)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lengths-only", action="store_true",
        help="write the records' token lengths instead, one per line (for odb-plan --lengths)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.records < 1 or not args.length_scale > 0:
        parser.error("--records must be >= 1 and --length-scale > 0")
    if args.lengths_only:
        shortest = shortest_conversation(QwenTokenizer())
        targets = target_lengths(args.records, args.length_scale, args.seed, shortest)
        args.out.write_text("".join(f"{max(shortest, n)}\n" for n in targets))
        return 0
    summary = write_jsonl(args.out, args.records, args.length_scale, args.seed)
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
