"""Image-text conversations tokenized with their visual tokens, inside the loader workers.

A record is ``{"id", "images": [path, ...], "messages": [...]}`` (LLaVA style), one
``<image>`` placeholder in a user turn per path, in order; a record without ``images``
is a text-only sample of the same set. ``dataset[i]`` reads the images, runs the image
processor and expands each placeholder into
``<|vision_start|> <|image_pad|> x n <|vision_end|>``, ``n`` the image's LLM tokens, so
the length the loader observes is the sample's true cost, visual tokens included. No
visual token is ever supervised (labels ``-100``).

A sample carries ``input_ids``, ``labels``, ``pixel_values`` (float32 ``[patches, D]``),
``image_grid_thw`` (long ``[images, 3]``), both empty for a text-only sample, and its
rotary ``position_ids`` (long ``[rows, L]``, row 0 the text positions; the family's
position rule: :meth:`~odb_lightning.data.vision_family.VisionFamily.positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import ChatRecord, Role
from odb_lightning.data.dataset import ChatDataset, as_sample
from odb_lightning.data.template import TokenizedChat, checked_message, spelled_control_token
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.data.vision import (
    IMAGE_PLACEHOLDER,
    ImageSettings,
    VisionTokens,
    image_token_count,
    load_image,
)
from odb_lightning.data.vision_family import VisionFamily, vision_family_of
from odb_lightning.sample import (
    IGNORE_INDEX,
    IMAGE_GRID_THW,
    IMAGE_TOKENS,
    MROPE_POSITIONS,
    PIXEL_VALUES,
    TRUNCATED_FROM,
    BadSampleError,
    Sample,
)


def placeholder_count(messages: Sequence[Any]) -> int:
    """``<image>`` placeholders over every turn's content."""
    return sum(
        m["content"].count(IMAGE_PLACEHOLDER)
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


class VisionChatDataset(ChatDataset):
    """Conversations with images, tokenized with their visual tokens when read.

    Args:
        records: Records with optional ``images`` (paths; relative ones are read under
            ``image_root``).
        tokenizer: The chat tokenizer (text is encoded with it, and the family reads the
            vision ids from it).
        max_seq_len: Samples are right-truncated to this many tokens; a sample whose
            cut would fall inside or before an image is a bad sample (an image cannot be
            cut without changing its patches).
        images: Resize and patch settings.
        family: The vision family (its image processor, token ids and position rule);
            ``None``: the registered family that fits ``tokenizer``, with its ids
            (:func:`~odb_lightning.data.vision_family.vision_family_of`).
        image_root: Directory of relative image paths.
    """

    def __init__(
        self,
        records: Sequence[ChatRecord],
        tokenizer: ChatTokenizer,
        max_seq_len: int,
        images: ImageSettings | None = None,
        family: VisionFamily | None = None,
        image_root: str | Path | None = None,
        system_prompt: str | None = None,
    ) -> None:
        # ChatML: tokenize_with_images places the image blocks in its layout.
        super().__init__(records, tokenizer, max_seq_len, system_prompt, template="chatml")
        self.images = images or ImageSettings()
        self.family = family or vision_family_of(tokenizer)
        self.vision_tokens = self.family.tokens
        self.image_root = None if image_root is None else Path(image_root)
        self.processor = self.family.image_processor(self.images)

    def length_settings(self) -> dict[str, object]:
        """The text settings plus everything that changes an image's token count."""
        images = self.images
        return super().length_settings() | {
            "template": f"chatml+{self.family.name}_images",
            "images": [images.min_pixels, images.max_pixels, images.patch_size, images.merge_size],
            "vision_tokens": sorted(self.vision_tokens.ids),
        }

    def _image_paths(self, record: dict[str, Any], index: int) -> list[Path]:
        paths = record.get("images", [])
        if paths is None:
            return []
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise BadSampleError(index, "images", f"must be a list of paths, got {paths!r}")
        root = self.image_root
        return [Path(p) if root is None or Path(p).is_absolute() else root / p for p in paths]

    def __getitem__(self, index: int) -> Sample:
        record: Any = self.records[index]
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not messages:
            return super().__getitem__(index)  # its error names the field
        paths = self._image_paths(record, index)
        found = placeholder_count(messages)
        if found != len(paths):
            problem = (
                f"has {len(paths)} path(s), but the turns hold {found} "
                f"{IMAGE_PLACEHOLDER!r} placeholder(s)"
            )
            raise BadSampleError(index, "images", problem)
        pictures = [
            load_image(path, index, f"images[{k}]", self.images.max_image_pixels)
            for k, path in enumerate(paths)
        ]
        pixel_values, grid_thw = self.processor(pictures)
        counts = [image_token_count(g, self.images.merge_size) for g in grid_thw]
        try:
            chat = tokenize_with_images(
                self.template.with_system_prompt(messages),
                self.template.tokenizer,
                counts,
                self.vision_tokens,
                self.max_seq_len,
            )
        except BadSampleError as error:
            raise error.at_index(index) from error
        sample = as_sample(chat.input_ids, chat.labels)
        sample[IMAGE_TOKENS] = sum(counts)  # type: ignore[assignment]
        sample[PIXEL_VALUES] = pixel_values
        sample[IMAGE_GRID_THW] = grid_thw
        sample[MROPE_POSITIONS] = self.family.positions(
            sample["input_ids"], grid_thw, self.images.merge_size
        )
        if chat.truncated:
            sample[TRUNCATED_FROM] = chat.full_length  # type: ignore[assignment]
        return sample


def tokenize_with_images(
    messages: Sequence[Any],
    tokenizer: ChatTokenizer,
    image_tokens: Sequence[int],
    vision: VisionTokens,
    max_seq_len: int | None,
) -> TokenizedChat:
    """ChatML with each ``<image>`` expanded to its image's tokens, SFT labels masked.

    The layout is the ``chatml`` layout's (header, content, ``<|im_end|>``, newline;
    assistant content and its ``<|im_end|>`` supervised), each run of text between control
    tokens encoded in one pass (the ids of the text layouts for a conversation without
    images); the image blocks are never supervised. A conversation whose text spells a
    control token trains nothing, as in the text layouts.

    Raises:
        BadSampleError: A malformed message, a placeholder outside a user or system
            turn, or a ``max_seq_len`` cut that would fall inside or before an image.
    """
    input_ids: list[int] = []
    labels: list[int] = []
    newline = tokenizer.encode_text("\n")
    remaining = iter(image_tokens)
    last_image_end = -1
    for position, message in enumerate(messages):
        role, content = checked_message(message, position).values()
        pieces = content.split(IMAGE_PLACEHOLDER)
        if len(pieces) > 1 and role == Role.ASSISTANT.value:
            field = f"messages[{position}].content"
            raise BadSampleError(None, field, "holds an image placeholder in an assistant turn")
        supervised = role == Role.ASSISTANT.value
        input_ids.append(tokenizer.im_start_id)
        labels.append(IGNORE_INDEX)
        for k, piece in enumerate(pieces):
            if k:
                block = [vision.vision_start_id, *[vision.image_pad_id] * next(remaining)]
                input_ids += [*block, vision.vision_end_id]
                labels += [IGNORE_INDEX] * (len(block) + 1)
                last_image_end = len(input_ids) - 1
            # The header and the text up to the first image are one run between control
            # tokens, encoded in one pass as the tokenizer's own template would.
            header = f"{role}\n" if k == 0 else ""
            ids, offsets = tokenizer.encode_rendered(header + piece)
            input_ids += ids
            labels += [
                t if supervised and end > len(header) else IGNORE_INDEX
                for t, (_, end) in zip(ids, offsets, strict=True)
            ]
        input_ids += [tokenizer.im_end_id, *newline]
        labels += [tokenizer.im_end_id if supervised else IGNORE_INDEX]
        labels += [IGNORE_INDEX] * len(newline)
    full_length = len(input_ids)
    if max_seq_len is not None and full_length > max_seq_len:
        if last_image_end >= max_seq_len:
            problem = (
                f"has {full_length} tokens with its images, more than max_seq_len="
                f"{max_seq_len}, and the cut would split an image (its last ends at token "
                f"{last_image_end})"
            )
            raise BadSampleError(None, "images", problem)
        input_ids, labels = input_ids[:max_seq_len], labels[:max_seq_len]
    if spelled_control_token(tokenizer, messages) is not None:  # trains nothing, as in text
        return TokenizedChat(input_ids, [IGNORE_INDEX] * len(input_ids), full_length, True)
    return TokenizedChat(input_ids, labels, full_length)
