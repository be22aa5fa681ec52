"""The benchmark stand-in model, ``conf/model/cpu_bench.yaml``, built outside ``train.py``.

Shared by the studies that train it in their own loop (``experiments/throughput``) or
charge its FLOPs to the runs of ``train.py model=cpu_bench`` (``experiments/ablation``,
``experiments/odb_vs_standard``). A module of its own, not part of ``experiments.common``:
it imports torch, transformers and Lightning, which the simulator studies never load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PretrainedConfig

from experiments.common import ROOT
from odb_lightning.lit.model.module import CausalLMModule

PRESET = "cpu_bench"
"""``conf/model/cpu_bench.yaml``."""


def model_preset(name: str, overrides: Sequence[str] = ()) -> Any:
    """The ``model`` node of ``conf/model/<name>.yaml``, composed by Hydra (the presets
    keep only what differs from the generated defaults), with Hydra ``overrides`` such
    as ``model.architecture.hidden_size=64``."""
    from hydra import compose, initialize_config_dir

    from odb_lightning.app.config_store import prepare_composition

    prepare_composition()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("train", overrides=[f"model={name}", *overrides]).model


def build_preset(name: str, seed: int = 0, overrides: Sequence[str] = ()) -> CausalLMModule:
    """The module of ``conf/model/<name>.yaml`` (with Hydra ``overrides``), its model
    initialised from ``seed``."""
    import hydra

    torch.manual_seed(seed)
    module = hydra.utils.instantiate(model_preset(name, overrides), _convert_="all")
    module.configure_model()
    return module


def build_cpu_bench(seed: int = 0, overrides: Sequence[str] = ()) -> CausalLMModule:
    """``cpu_bench.yaml``'s module (with Hydra ``overrides``, e.g. a smaller body),
    initialised from ``seed``."""
    return build_preset(PRESET, seed, overrides)


def cpu_bench_config() -> PretrainedConfig:
    """The stand-in's model config (what ``flops_per_token`` reads)."""
    import hydra

    return hydra.utils.instantiate(model_preset(PRESET).architecture).random_init()
