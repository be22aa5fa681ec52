"""LoRA adapters through ``peft``: added to a model, and given their initial values again
after a deferred (``meta``) build allocates them."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from odb_lightning.lit.model.config import LoraSettings


def add_lora(model: PreTrainedModel, settings: LoraSettings) -> nn.Module:
    """``model`` with LoRA adapters on ``settings.target_modules``; only they train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
    )
    return get_peft_model(model, config)


def reset_lora(model: nn.Module) -> None:
    """Give LoRA adapters their initial values again (A random, B zero)."""
    for module in model.modules():
        reset = getattr(module, "reset_lora_parameters", None)
        if callable(reset) and hasattr(module, "active_adapters"):
            for adapter in module.active_adapters:
                reset(adapter, True)
