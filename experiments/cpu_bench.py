"""The benchmark stand-in model, ``conf/model/cpu_bench.yaml``, built outside Hydra.

Shared by the studies that train it in their own loop (``experiments/throughput``) or
charge its FLOPs to the runs of ``train.py model=cpu_bench`` (``experiments/ablation``,
``experiments/odb_vs_standard``). A module of its own, not part of ``experiments.common``:
it imports torch, transformers and Lightning, which the simulator studies never load.
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from transformers import PretrainedConfig

from experiments.common import ROOT
from odb_lightning.lit.module import CausalLMModule

CONFIG = ROOT / "conf" / "model" / "cpu_bench.yaml"


def build_cpu_bench(seed: int = 0) -> CausalLMModule:
    """``cpu_bench.yaml``'s architecture, initialised from ``seed``."""
    bench = OmegaConf.load(CONFIG)
    torch.manual_seed(seed)
    module = CausalLMModule(
        hidden_size=bench.hidden_size,
        num_hidden_layers=bench.num_hidden_layers,
        num_attention_heads=bench.num_attention_heads,
        num_key_value_heads=bench.num_key_value_heads,
        intermediate_size=bench.intermediate_size,
        token_id_fold=bench.token_id_fold,
    )
    module.configure_model()
    return module


def cpu_bench_config() -> PretrainedConfig:
    """The stand-in's model config (what ``flops_per_token`` reads)."""
    return CausalLMModule(token_id_fold=OmegaConf.load(CONFIG).token_id_fold).random_init
