"""Peak host memory per rank of building a Qwen2.5-1.5B-shaped model (``model=qwen2_5_1_5b``,
float32, random init): built whole in one process, as every DDP rank on CPU builds it,
against deferred (``meta``) init with per-layer FSDP2 sharding at 2 ranks.

    .venv/bin/python -m experiments.model_memory.run          # about 2 minutes, ~10 GB RAM

Each arm runs in fresh processes; a rank reports its peak resident set (``ru_maxrss``)
and its resident set once the model is ready (for FSDP2: after Lightning's setup, at
``on_fit_start``). ``results.json`` gets the figures and the parameter bytes for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments.common import ROOT, results_meta

HERE = Path(__file__).resolve().parent
PRESET = "qwen2_5_1_5b"
"""``conf/model/qwen2_5_1_5b.yaml``."""


def _arguments() -> dict[str, Any]:
    """The preset's constructor arguments (float32, random init), with a fixed schedule
    length: the probes stop before training, so nothing tells the cosine its length."""
    import hydra

    from experiments.cpu_bench import model_preset

    node = model_preset(PRESET)
    node.scheduler.decay_steps = 1
    return hydra.utils.instantiate(node, _partial_=True, _convert_="all").keywords


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set of this process in MiB."""
    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return current / 2**20, peak_kib / 1024


def eager(out: Path) -> None:
    """The whole model in this process (what ``configure_model`` does without sharding)."""
    from odb_lightning.lit.model.module import CausalLMModule

    module = CausalLMModule(**_arguments())
    module.configure_model()
    current, peak = _rss_mib()
    parameters = sum(p.numel() for p in module.parameters())
    out.write_text(json.dumps({"rank": 0, "rss_mib": current, "peak_rss_mib": peak,
                               "parameters": parameters}))  # fmt: skip


def sharded(out_dir: Path) -> None:
    """One rank of a 2-rank FSDP2 job: Lightning's setup, stopped before the first batch."""
    from odb_lightning.lit.model.module import CausalLMModule
    from testing.harness.sharded_setup import fit_setup_only, one_batch_loader

    class Probe(CausalLMModule):
        def on_fit_start(self) -> None:
            super().on_fit_start()
            current, peak = _rss_mib()
            local = sum(p.to_local().numel() for p in self.parameters())
            record = {"rank": self.global_rank, "rss_mib": current, "peak_rss_mib": peak,
                      "local_parameters": local,
                      "parameters": sum(p.numel() for p in self.parameters())}  # fmt: skip
            (out_dir / f"rank{self.global_rank}.json").write_text(json.dumps(record))

        def train_dataloader(self) -> Any:
            return one_batch_loader()

    fit_setup_only(Probe(**_arguments()))


def _run(arm: str, out: Path) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "experiments.model_memory.run", "--arm", arm, str(out)]
    if arm == "fsdp2":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node=2", "-m", "experiments.model_memory.run",
                   "--arm", arm, str(out)]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, timeout=1200)
    files = [out] if arm == "eager" else sorted(out.glob("rank*.json"))
    return [json.loads(f.read_text()) for f in files]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=("eager", "fsdp2"))
    parser.add_argument("out", nargs="?")
    args = parser.parse_args()
    if args.arm == "eager":
        return eager(Path(args.out))
    if args.arm == "fsdp2":
        return sharded(Path(args.out))
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        (base / "fsdp2").mkdir()
        rows = {"eager_1_process": _run("eager", base / "eager.json"),
                "fsdp2_2_ranks": _run("fsdp2", base / "fsdp2")}  # fmt: skip
    parameters = rows["eager_1_process"][0]["parameters"]
    result = {
        "meta": results_meta(),
        "model": "qwen2_5_1_5b preset (float32, random init)",
        "parameters": parameters,
        "parameter_mib": parameters * 4 / 2**20,
        "arms": rows,
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    for arm, ranks in rows.items():
        for rank in ranks:
            print(f"{arm:16s} rank {rank['rank']}: peak RSS {rank['peak_rss_mib']:8.0f} MiB, "
                  f"ready {rank['rss_mib']:8.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
