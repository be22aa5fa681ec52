"""Seeded conversation augmentation, applied per item inside the loader workers.

Both change a sample's token length (what makes an offline length cache stale and what
online batching absorbs):

* **System prompt**: with ``system_prompt_probability`` a conversation without a system
  message gets one drawn from ``system_prompts``; its own system message is data (the
  answers may depend on it) and is never replaced.
* **Trailing-turn drop**: with ``drop_trailing_turns_probability`` a random number >= 1 of
  trailing exchanges is cut off; the kept prefix ends with an assistant turn that answers
  a user turn, so at least one supervised exchange remains.

Every draw comes from ``make_rng(seed, "augment", epoch, index)``: the result depends only
on ``(seed, epoch, index)``, never on workers or access order, and changes every epoch.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from odb_lightning.core.order import make_rng
from odb_lightning.data.conversation import Message, Role
from odb_lightning.data.template import QWEN25_SYSTEM_PROMPT

DEFAULT_SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    QWEN25_SYSTEM_PROMPT,
    "You are a knowledgeable assistant. Answer accurately and concisely.",
    "You are a friendly AI assistant. Explain your reasoning clearly and step by step.",
    "You are an expert assistant. If a question is ambiguous, say what you assume.",
)


def _checked_probability(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"augmentation.{name} must be a float, got {type(value).__name__}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"augmentation.{name} must be in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Augmentation:
    """Which augmentations run (see the module docstring), how often, and their seed.

    Attributes:
        system_prompts: Drawn from uniformly; must not be empty when
            ``system_prompt_probability > 0``.
    """

    system_prompts: tuple[str, ...] = ()
    system_prompt_probability: float = 0.0
    drop_trailing_turns_probability: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        # Hydra hands lists (ListConfig) over; store a tuple so the settings stay hashable.
        if isinstance(self.system_prompts, str) or not isinstance(self.system_prompts, Sequence):
            kind = type(self.system_prompts).__name__
            raise TypeError(f"augmentation.system_prompts must be a sequence of str, got {kind}")
        prompts = tuple(self.system_prompts)
        for k, prompt in enumerate(prompts):
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(
                    f"augmentation.system_prompts[{k}] must be a non-empty str, got {prompt!r}"
                )
        object.__setattr__(self, "system_prompts", prompts)
        for name in ("system_prompt_probability", "drop_trailing_turns_probability"):
            object.__setattr__(self, name, _checked_probability(getattr(self, name), name))
        if self.system_prompt_probability > 0 and not prompts:
            raise ValueError(
                "augmentation.system_prompts is empty but system_prompt_probability is "
                f"{self.system_prompt_probability}; give prompts (e.g. DEFAULT_SYSTEM_PROMPTS)"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"augmentation.seed must be an int, got {self.seed!r}")

    @property
    def enabled(self) -> bool:
        """Whether any augmentation can change a sample."""
        return self.system_prompt_probability > 0 or self.drop_trailing_turns_probability > 0

    @property
    def fingerprint(self) -> str:
        """Canonical JSON of the settings (part of a length-cache key)."""
        settings = asdict(self)
        settings["system_prompts"] = list(self.system_prompts)
        return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def trailing_cut_points(messages: Sequence[Message]) -> list[int]:
    """Prefix lengths ``k < len(messages)`` that a trailing-turn drop may keep.

    ``messages[:k]`` must end with an assistant turn preceded (somewhere) by a user turn,
    so the kept conversation still holds one supervised exchange.
    """
    cuts: list[int] = []
    seen_user = False
    for k, message in enumerate(messages[:-1], start=1):
        role = _role(message)
        if role == Role.ASSISTANT.value and seen_user:
            cuts.append(k)
        seen_user = seen_user or role == Role.USER.value
    return cuts


def _role(message: object) -> object:
    """The role of a well-formed message; malformed ones are left to the template's check,
    which names the sample and the field."""
    return message.get("role") if isinstance(message, dict) else None


def _maybe_add_system_prompt(
    messages: list[Message], augmentation: Augmentation, rng: random.Random
) -> list[Message]:
    draw = rng.random()
    has_system = bool(messages) and _role(messages[0]) == Role.SYSTEM.value
    if has_system or draw >= augmentation.system_prompt_probability:
        return messages
    prompt = augmentation.system_prompts[rng.randrange(len(augmentation.system_prompts))]
    return [{"role": Role.SYSTEM.value, "content": prompt}, *messages]


def _maybe_drop_trailing_turns(
    messages: list[Message], augmentation: Augmentation, rng: random.Random
) -> list[Message]:
    draw = rng.random()
    cuts = trailing_cut_points(messages)
    if not cuts or draw >= augmentation.drop_trailing_turns_probability:
        return messages
    return messages[: cuts[rng.randrange(len(cuts))]]


def augment_messages(
    messages: Sequence[Message], augmentation: Augmentation, epoch: int, index: int
) -> list[Message]:
    """The conversation at dataset ``index`` as augmented in ``epoch``.

    Returns:
        A new list; ``messages`` is never modified (message dicts are shared, not copied:
        nothing here mutates them).
    """
    result = list(messages)
    if not augmentation.enabled:
        return result
    rng = make_rng(augmentation.seed, "augment", epoch, index)
    # A fixed draw order (drop first, then the prompt) keeps the result a pure function of
    # (settings, epoch, index).
    result = _maybe_drop_trailing_turns(result, augmentation, rng)
    return _maybe_add_system_prompt(result, augmentation, rng)
