"""The sample contract between the data layer and the runtime.

A sample is a mapping with ``input_ids`` (1-D integer tensor of ``L`` tokens) and
optionally ``labels`` (same shape; ``-100`` = not supervised). Labels follow the Hugging
Face convention: the model shifts them, so position ``t`` is scored against
``labels[t + 1]``, position 0 is never a target, and the supervised-token count is
``sum(labels[1:] != -100)``. Without ``labels`` every token but the first is supervised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

# torch is imported where a function uses it: the error and the keys below are what the
# config and data checks need (odb-check), before torch loads.
if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100
"""Label of a position that has no loss."""

Sample = dict[str, "torch.Tensor"]
"""``{"input_ids": LongTensor[L], "labels": LongTensor[L]}``."""


class BadSampleError(ValueError):
    """A sample the pipeline cannot batch: missing key, wrong dtype or rank, empty, too
    long, or a record its preprocessing rejects. The message names the dataset index and
    the field.

    Attributes:
        index: Dataset index (``None`` while not yet known, e.g. inside the template).
        field: The offending field, e.g. ``"input_ids"`` or ``"messages[1].role"``.
        problem: What is wrong, without the location.
    """

    def __init__(self, index: int | None, field: str, problem: str) -> None:
        where = "sample" if index is None else f"sample {index}"
        super().__init__(f"{where}: field '{field}' {problem}")
        self.index, self.field, self.problem = index, field, problem

    def __reduce__(self) -> tuple[type, tuple[int | None, str, str]]:
        return (type(self), (self.index, self.field, self.problem))

    def at_index(self, index: int) -> BadSampleError:
        """The same error, located at dataset index ``index``."""
        return BadSampleError(index, self.field, self.problem)


class SampleStats(NamedTuple):
    """What batching needs to know about a valid sample."""

    length: int
    num_loss_tokens: int


def supervised_targets(labels: torch.Tensor) -> torch.Tensor:
    """Bool mask ``[..., L - 1]``: position ``t`` has a target (``labels[..., t + 1]``
    is not ``-100``)."""
    return labels[..., 1:] != IGNORE_INDEX


def count_loss_tokens(labels: torch.Tensor | Sequence[int]) -> int:
    """Supervised positions after the causal shift: the denominator of the loss."""
    import torch

    return int(supervised_targets(torch.as_tensor(labels)).sum())


class SampleLimits(NamedTuple):
    """What a sample must fit: ``None`` for no limit.

    Attributes:
        max_seq_len: Longest allowed ``input_ids``.
        vocab_size: Token ids (and supervised labels) must be below it.
    """

    max_seq_len: int | None = None
    vocab_size: int | None = None


NO_LIMITS = SampleLimits()
"""No length limit, no vocabulary check."""


def _is_numpy_array(value: object) -> bool:
    """A NumPy array or memmap, recognized without importing NumPy here."""
    return type(value).__module__ == "numpy" and hasattr(value, "dtype")


def _token_tensor(value: object, index: int, field: str) -> torch.Tensor:
    """``value`` as a 1-D int64 tensor: any integer dtype, of a tensor or a NumPy array
    (e.g. a slice of a pre-tokenized ``uint16`` memmap), is widened, so that every check
    and the collate see the true ids."""
    import torch

    if _is_numpy_array(value):
        array: Any = value
        if array.dtype.kind not in "iu":
            raise BadSampleError(index, field, f"must have an integer dtype, got {array.dtype}")
        value = torch.from_numpy(array.astype("int64"))  # a copy: memmaps are read-only
    elif not isinstance(value, torch.Tensor):
        problem = f"must be a torch.Tensor of token ids, got {type(value).__name__}"
        raise BadSampleError(index, field, problem)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise BadSampleError(index, field, f"must have an integer dtype, got {value.dtype}")
    if value.dim() != 1:
        raise BadSampleError(index, field, f"must be 1-D, got shape {tuple(value.shape)}")
    return value.to(torch.int64)  # no copy when it already is


def _check_vocab(ids: torch.Tensor, index: int, field: str, vocab_size: int | None) -> None:
    if vocab_size is None or ids.numel() == 0:
        return
    top = int(ids.max())
    if top >= vocab_size:
        problem = f"contains token id {top}, not below the model's vocab_size={vocab_size}"
        raise BadSampleError(index, field, problem)


PIXEL_VALUES = "pixel_values"
"""Key of an image-text sample's patches: float ``[patches, D]`` (empty without image)."""
IMAGE_GRID_THW = "image_grid_thw"
"""Key of an image-text sample's patch grids: long ``[images, 3]``, ``(t, h, w)`` each."""
MROPE_POSITIONS = "position_ids"
"""Key of an image-text sample's rotary positions: long ``[rows, L]``, row 0 the text
positions and the rest as the vision family lays them out (M-RoPE: temporal, height and
width); see :mod:`odb_lightning.runtime.vlm_batch`."""


IMAGE_TOKENS = "num_image_tokens"
"""Key an image-text dataset sets on a sample: how many of its tokens stand for images
(an ``int``; the collates ignore it, the loader's epoch statistics sum it)."""


def count_image_tokens(sample: Mapping[str, Any]) -> int:
    """The tokens of a sample that stand for images (0 where the dataset does not say)."""
    count = sample.get(IMAGE_TOKENS, 0)
    return count if isinstance(count, int) else 0


def count_patch_squares(sample: Mapping[str, Any]) -> int:
    """``sum(p**2)`` over a sample's images of ``p`` patches each (the quadratic term of
    the patch budget: the vision tower attends within each image)."""
    import torch

    grid = sample.get(IMAGE_GRID_THW)
    if not isinstance(grid, torch.Tensor) or grid.numel() == 0:
        return 0
    return int((grid.reshape(-1, 3).prod(dim=-1) ** 2).sum())


def count_image_patches(sample: Mapping[str, Any]) -> int:
    """ViT patches of a sample's images (``sum(t * h * w)``; 0 for a text-only sample):
    the vision tower's share of the sample's cost, observed with its length."""
    import torch

    grid = sample.get(IMAGE_GRID_THW)
    if not isinstance(grid, torch.Tensor) or grid.numel() == 0:
        return 0
    return int(grid.reshape(-1, 3).prod(dim=-1).sum())


TRUNCATED_FROM = "truncated_from"
"""Sample key a dataset sets on a sample it cut to ``max_seq_len``: the length before
the cut (the collates ignore it; the loader's epoch statistics count such samples)."""


def is_truncated(sample: Mapping[str, Any], length: int) -> bool:
    """Whether a valid sample of ``length`` tokens was cut by its dataset."""
    full_length = sample.get(TRUNCATED_FROM)
    return isinstance(full_length, int) and full_length > length


def normalize_sample(
    sample: object, index: int, limits: SampleLimits = NO_LIMITS
) -> tuple[dict[str, object], SampleStats]:
    """Validate a sample, widen its token ids to int64 and measure it: the one check
    every sample passes before it is batched.

    Args:
        sample: What ``dataset[index]`` returned.
        index: Its dataset index (named in every error).
        limits: Longest allowed ``input_ids`` and the vocabulary size (``None``: no
            limit).

    Returns:
        A copy of the sample with ``input_ids`` (and ``labels``) as int64 tensors, and
        its stats.

    Raises:
        BadSampleError: Naming the index, the field at fault and the offending value.
    """
    if not isinstance(sample, Mapping):
        problem = f"must be a mapping with 'input_ids', got {type(sample).__name__}"
        raise BadSampleError(index, "<sample>", problem)
    if "input_ids" not in sample:
        raise BadSampleError(index, "input_ids", f"is missing (keys: {sorted(sample)})")
    input_ids = _token_tensor(sample["input_ids"], index, "input_ids")
    length = input_ids.numel()
    if length == 0:
        raise BadSampleError(index, "input_ids", "is empty")
    max_seq_len = limits.max_seq_len
    if max_seq_len is not None and length > max_seq_len:
        problem = f"has {length} tokens, more than max_seq_len={max_seq_len}"
        raise BadSampleError(index, "input_ids", problem)
    lowest = int(input_ids.min())
    if lowest < 0:
        raise BadSampleError(index, "input_ids", f"contains negative token id {lowest}")
    _check_vocab(input_ids, index, "input_ids", limits.vocab_size)
    normalized = {**sample, "input_ids": input_ids}
    if "labels" not in sample:
        return normalized, SampleStats(length, length - 1)
    labels = _token_tensor(sample["labels"], index, "labels")
    if labels.shape != input_ids.shape:
        problem = f"has shape {tuple(labels.shape)}, 'input_ids' has {tuple(input_ids.shape)}"
        raise BadSampleError(index, "labels", problem)
    # Anything below 0 but -100 would index the vocabulary from the end (or crash the loss).
    negative = labels[(labels < 0) & (labels != IGNORE_INDEX)]
    if negative.numel():
        problem = f"contains negative value {int(negative[0])}, other than {IGNORE_INDEX} (no loss)"
        raise BadSampleError(index, "labels", problem)
    _check_vocab(labels, index, "labels", limits.vocab_size)
    normalized["labels"] = labels
    return normalized, SampleStats(length, count_loss_tokens(labels))


def inspect_sample(
    sample: object, index: int, max_seq_len: int | None, vocab_size: int | None = None
) -> SampleStats:
    """The stats of :func:`normalize_sample` (same checks, same errors)."""
    return normalize_sample(sample, index, SampleLimits(max_seq_len, vocab_size))[1]
