"""The step shapes the memory warm-up checks, per experiment preset.

    .venv/bin/python -m experiments.memory_shapes.run

Each preset is composed as ``train.py`` composes it; its data module is set up (for the
length-pass modes that measures every training sample), and the shapes are those
:class:`~odb_lightning.lit.memory.warmup.MemoryWarmup` runs at fit start: the batching config,
``data.sizes.max_seq_len``, the data module's ``length_range`` and ``largest_image``. Nothing is
trained; prints a Markdown table and writes ``results.json`` next to this script.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.common import results_meta
from odb_lightning.app.components import build_data
from odb_lightning.app.preview import compose_train_config
from odb_lightning.lit.memory.probe import worst_case_shapes

HERE = Path(__file__).resolve().parent
PRESETS = ("sharegpt_standard", "sharegpt_oracle", "sharegpt_odb", "sharegpt_packed", "llava_odb")


def preset_shapes(preset: str) -> dict:
    cfg = compose_train_config([f"experiment={preset}"])
    parts = build_data(cfg, world_size=1, device="cpu")
    datamodule = parts.datamodule
    datamodule.setup("fit")
    lengths = datamodule.length_range()
    max_seq_len = int(cfg.data.sizes.max_seq_len)
    batching = parts.batching
    image = datamodule.largest_image()
    shapes = worst_case_shapes(batching, max_seq_len, lengths, image)
    return {
        "preset": preset,
        "mode": batching.mode,
        "token_budget": batching.token_budget,
        "max_seq_len": max_seq_len,
        "length_range": lengths,
        "max_patches": batching.rows.max_patches,
        "shapes": [
            {
                "name": s.name,
                "rows": s.rows,
                "tokens": s.tokens,
                "one_row": s.one_row,
                "image_grid": s.image_grid,
            }
            for s in shapes
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    args = parser.parse_args()
    rows = [preset_shapes(p) for p in args.presets.split(",")]
    (HERE / "results.json").write_text(
        json.dumps({"meta": results_meta(), "presets": rows}, indent=2) + "\n"
    )
    print("| preset | mode | budget | max_seq_len | lengths seen | shape | rows x tokens |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        seen = "-" if row["length_range"] is None else "{}-{}".format(*row["length_range"])
        for i, s in enumerate(row["shapes"]):
            head = (
                f"| {row['preset']} | {row['mode']} | {row['token_budget']:,} | "
                f"{row['max_seq_len']:,} | {seen} |"
                if i == 0
                else "| | | | | |"
            )
            packed = " (one packed row)" if s["one_row"] else ""
            print(f"{head} {s['name']}{packed} | {s['rows']} x {s['tokens']:,} |")


if __name__ == "__main__":
    main()
