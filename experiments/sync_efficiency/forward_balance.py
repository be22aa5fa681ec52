"""Measured forward time per rank under the token cost and the FLOP cost (2 ranks, CPU).

One epoch of long samples (lognormal lengths, mean 1,500, CV 0.8, 1,024 to 6,144 tokens;
``--samples``) is dealt by need over 2 ranks and grouped by the simulator twice: under the
token cost (``attention_weight`` 0) and under the model's FLOP cost
(``attention_weight_of`` the body below). Every step's two groups are then run through the
same small decoder whose attention matters (Qwen2 shape: 4 layers of 256, MLP 512, a
4,096-token head; ``w L`` is 1.1 at 4,096 tokens): each group as its padded batch of random
ids, forward only, sdpa, one intra-op thread, timed one rank after the other on this
machine (the median of ``--repeats`` timings of each batch). Per step the slowest rank's
forward time over the mean of the two; the figure is the mean over steps (1.0: level).

    python -m experiments.sync_efficiency.forward_balance [--samples 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from experiments.common import results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.flops import attention_weight_of, decoder_matmul_parameters
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch

HERE = Path(__file__).resolve().parent
BUDGET = 16384
SHAPE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 4096}
MATMUL = decoder_matmul_parameters(
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=512,
    vocab_size=4096,
)
WEIGHT = attention_weight_of(4, 256, MATMUL)


def build_model() -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", tie_word_embeddings=True, **SHAPE)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def timed(model: torch.nn.Module, rows: int, length: int, repeats: int) -> float:
    ids = torch.randint(0, SHAPE["vocab_size"], (rows, length))
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(model: torch.nn.Module, lengths: list[int], weight: float, repeats: int) -> dict:
    config = BatchingConfig.of(token_budget=BUDGET, attention_weight=weight)
    result = simulate_dealt_epoch(lengths, 2, config)
    ratios, seconds, paced = [], [0.0, 0.0], 0.0
    for first, second in zip(*result.steps, strict=True):
        step = []
        for rank, s in enumerate((first, second)):
            took = 0.0 if s.group is None else timed(model, s.group.size, s.group.longest, repeats)
            seconds[rank] += took
            step.append(took)
        paced += max(step)  # the step takes as long as its slowest rank
        if max(step) > 0:
            ratios.append(max(step) / statistics.fmean(step))
    return {
        "attention_weight": weight,
        "steps_per_rank": len(result.steps[0]),
        "slowest_over_mean": statistics.fmean(ratios),
        "paced_forward_s": paced,
        "rank_forward_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    drawn = lognormal_lengths(args.samples, 1500, 0.8, seed=0, max_len=6144)
    lengths = [max(1024, n) for n in drawn]
    model = build_model()
    rows = {
        "token": measure(model, lengths, 0.0, args.repeats),
        "flop": measure(model, lengths, WEIGHT, args.repeats),
    }
    for name, row in rows.items():
        print(
            f"{name} cost: {row['steps_per_rank']} steps, slowest rank's forward over the "
            f"mean {row['slowest_over_mean']:.3f}",
            flush=True,
        )
    out = {"meta": results_meta(), "weight": WEIGHT, "rows": rows}
    (HERE / "forward_balance_results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
