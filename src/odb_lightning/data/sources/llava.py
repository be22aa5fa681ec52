"""LLaVA-style image-text records: a JSON Lines reader and an offline LLaVA-shaped set.

A line is ``{"id", "images": [path, ...], "messages": [{"role", "content"}, ...]}`` with
one ``<image>`` placeholder in a user turn per path; the original LLaVA layout
(``"image": path`` and ``"conversations": [{"from", "value"}]``) is read too. Lines are
checked when read (JSON, roles, contents, ``images`` a list of strings, as
:mod:`~odb_lightning.data.sources.jsonl` does); the image files themselves are read, and
their problems reported, in the loader workers (the bad-input policy of the loader).

:func:`build_llava_set` writes a LLaVA-shaped set offline: real pictures and real
questions of the easy-VQA package (several questions about one image per conversation,
as in LLaVA-Instruct), each picture written at a resolution drawn from a
:class:`~odb_lightning.data.image_generator.ResolutionProfile`.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import BadRecordError
from odb_lightning.data.formats import parse_turns
from odb_lightning.data.image_generator import ResolutionProfile, write_images
from odb_lightning.data.sources.jsonl import OnBadRecord, iter_jsonl_lines
from odb_lightning.data.sources.source_records import SourceReader, SourceRecords, source_version
from odb_lightning.data.sources.table import SourceRequest
from odb_lightning.data.vision import IMAGE_PLACEHOLDER

LLAVA_RESOLUTIONS = ResolutionProfile(mean_pixels=420_000, cv=0.35)
"""Photos around 750 x 560 px (COCO-like), a moderate spread."""


def parse_llava_line(raw: bytes, where: str, line_number: int) -> dict[str, Any]:
    """One line as ``{"id", "images", "messages"}``.

    Raises:
        BadRecordError: Invalid JSON, a bad ``id``, ``messages`` or ``images``.
    """
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRecordError(where, "<line>", f"invalid JSON: {error}") from error
    if not isinstance(value, dict):
        raise BadRecordError(where, "<line>", f"must be a JSON object, got {type(value).__name__}")
    if "conversations" in value and "messages" not in value:
        value["messages"] = [
            {"role": t.get("from"), "content": t.get("value")} if isinstance(t, dict) else t
            for t in value["conversations"]
        ]
    if "messages" not in value:
        raise BadRecordError(where, "messages", "missing")
    images = value.get("images", [value["image"]] if "image" in value else [])
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise BadRecordError(where, "images", f"must be a list of paths, got {images!r}")
    record_id = value.get("id", line_number)
    if not isinstance(record_id, str | int) or isinstance(record_id, bool):
        raise BadRecordError(where, "id", f"must be a string or integer, got {record_id!r}")
    messages = parse_turns(value["messages"], where, "messages")
    return {"id": record_id, "images": images, "messages": messages}


def _count_images(record: dict[str, Any], line_number: int, result: SourceRecords) -> None:
    result.counts["images"] += len(record["images"])
    result.counts["text_only"] += not record["images"]


def llava_source(
    path: str | Path,
    *,
    max_samples: int | None = None,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceReader:
    """The reader of :func:`llava_records` (records one at a time, for a record table)."""
    on_bad_record = OnBadRecord(on_bad_record)

    def read(result: SourceRecords) -> Iterator[dict[str, Any]]:
        return iter_jsonl_lines(
            path, parse_llava_line, max_samples, on_bad_record, result, _count_images
        )

    arguments = {"max_samples": max_samples, "on_bad_record": on_bad_record.value}
    return SourceReader("llava", read, source_version("llava", path), arguments, images=True)


def llava_records(
    path: str | Path,
    *,
    max_samples: int | None = None,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceRecords:
    """Read image-text records from a JSON Lines file into memory (see the module
    docstring; the data module reads them through a record table).

    Returns:
        Records, and counts ``read``, ``kept``, ``images`` (paths over the kept records),
        ``text_only`` (kept records without an image) and ``dropped/bad_record``.
    """
    return llava_source(path, max_samples=max_samples, on_bad_record=on_bad_record).collect()


def easy_vqa_conversations(seed: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every easy-VQA training image with its questions and answers (shuffled, seeded):
    ``(image path, [(question, answer), ...])``."""
    from easy_vqa import get_train_image_paths, get_train_questions

    questions, answers, image_ids = get_train_questions()
    paths = get_train_image_paths()
    by_image: dict[int, list[tuple[str, str]]] = {}
    for question, answer, image_id in zip(questions, answers, image_ids, strict=True):
        by_image.setdefault(image_id, []).append((question, answer))
    items = [(paths[i], qa) for i, qa in sorted(by_image.items())]
    random.Random(seed).shuffle(items)
    return items


def image_conversation(qa: list[tuple[str, str]], turns: int) -> list[dict[str, str]]:
    """``turns`` question/answer exchanges about one image; the first question opens with
    the image placeholder."""
    messages = []
    for k, (question, answer) in enumerate(qa[:turns]):
        prompt = f"{IMAGE_PLACEHOLDER}\n{question}" if k == 0 else question
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return messages


def write_jsonl(records: list[dict[str, Any]], path: Path) -> Path:
    """``records`` as JSON Lines at ``path``, written whole, then renamed (ranks may write
    the same set at once); a file that holds them already is left as it is, so its record
    table stays valid."""
    text = "".join(json.dumps(record) + "\n" for record in records).encode("utf-8")
    if path.is_file() and path.read_bytes() == text:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(text)
    os.replace(partial, path)
    return path


def build_llava_set(
    out_dir: str | Path,
    num_samples: int,
    seed: int = 0,
    resolutions: ResolutionProfile = LLAVA_RESOLUTIONS,
) -> Path:
    """Write a LLaVA-shaped set under ``out_dir``: ``llava.jsonl`` and its images.

    Each record is one easy-VQA picture at a drawn resolution with 1 to 6 of its
    question/answer exchanges. Returns the JSON Lines path (relative image paths, read
    under ``out_dir``).
    """
    out_dir = Path(out_dir)
    items = easy_vqa_conversations(seed)
    if not 1 <= num_samples <= len(items):
        raise ValueError(f"num_samples must be in [1, {len(items)}], got {num_samples}")
    items = items[:num_samples]
    sizes = resolutions.draw(num_samples, seed)
    images = write_images([p for p, _ in items], sizes, out_dir / "images", f"llava_{seed}_")
    rng = random.Random(seed + 1)
    records = [
        {
            "id": f"llava-{k}",
            "images": [str(image.relative_to(out_dir))],
            "messages": image_conversation(qa, rng.randint(1, 6)),
        }
        for k, ((_, qa), image) in enumerate(zip(items, images, strict=True))
    ]
    return write_jsonl(records, out_dir / f"llava_{seed}_{num_samples}.jsonl")


DEFAULT_SET_SAMPLES = 512
"""Records of a written image-text set when ``max_samples`` is unset."""


def reader(request: SourceRequest) -> SourceReader:
    """The source table's reader of an image-text JSON Lines file (``request.path``:
    located by the entry's ``image_file``)."""
    return llava_source(
        request.path, max_samples=request.max_samples, on_bad_record=request.on_bad_record
    )


def user_file(request: SourceRequest) -> Path:
    """``llava_jsonl``: the user's file."""
    return Path(request.path)


def written_set(request: SourceRequest) -> Path:
    """``llava``: the set written (once) under ``set_dir``, ``max_samples`` records (512
    when unset), drawn by the seed."""
    count = request.max_samples or DEFAULT_SET_SAMPLES
    return build_llava_set(request.set_dir, count, seed=request.seed)
