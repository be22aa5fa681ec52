"""Moved bytes of image-text samples when the ranks group across ranks (8 and 64 ranks).

An image-text sample carries its processed pixels (float32, ``t x h x w`` patches of
``3 x 2 x 14 x 14`` values each: about 18.8 KB per visual token), so the samples a pooled
round moves weigh a hundred times a text sample's. Per set (the LLaVA- and
ShareGPT4o-shaped sets of ``experiments/vlm``, 1,000 records each through the real
pipeline, ``--measure``), every sample's LLM length, image tokens, payload bytes (what the
collate process holds: ``runtime.transport.dump_sample``) and wire bytes (the payload
through ``runtime.transport.pack_moved``) are recorded in ``image_text_samples.json``.
The epochs draw ``--per-rank`` samples a rank from them (seeded, with replacement) and
run the dealt simulator twice: pooled rounds that always group the union (the plan
before) and the defaults (the local plan where it keeps the level). The window is capped
by its bytes (``window_max_mib``, 1,024 MiB), as a run's is.

Wire bytes are given twice: as measured on these sets' pictures (easy-VQA drawings of flat
colours, which zlib takes to a sixty-fourth) and at the ratio measured on pictures of
uniform noise, the least compressible (``NOISE_PIXEL_RATIO``; text at its ShareGPT
ratio): a bound for photographs.

    python -m experiments.sync_efficiency.image_text [--measure 1000] [--worlds 8,64]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from experiments.common import results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate_dealt_epoch

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "image_text_samples.json"
RESULTS = HERE / "image_text_results.json"
BUDGET = 16384
NOISE_PIXEL_RATIO = 0.232
"""``pack_moved`` of the pixel values of a 750 x 560 picture of uniform noise over their
float32 bytes (the Qwen2-VL processor's output; 10.2 MB -> 2.4 MB)."""
TEXT_RATIO = 0.135
"""``pack_moved`` of ShareGPT payloads over their bytes (2.18 of 16.18 bytes a token)."""
TEXT_BYTES_PER_TOKEN = 16


def measure(count: int) -> dict[str, dict[str, list[int]]]:
    """Every sample of each set through the real pipeline (``experiments.vlm.run``)."""
    import tempfile

    from experiments.vlm import run as vlm
    from odb_lightning.runtime.transport import dump_sample, pack_moved
    from odb_lightning.sample import count_image_tokens

    sets: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for name, build in vlm.SETS.items():
            records = vlm.llava_records(build(out, count, seed=0)).records
            dataset = vlm.VisionChatDataset(
                records, vlm.QwenTokenizer(), vlm.MAX_SEQ_LEN, vlm.IMAGES, image_root=out
            )
            rows: dict[str, list[int]] = {
                "length": [],
                "image_tokens": [],
                "payload": [],
                "wire": [],
            }
            for index in range(len(dataset)):
                sample = dataset[index]
                payload = dump_sample(sample)
                rows["length"].append(int(sample["input_ids"].numel()))
                rows["image_tokens"].append(count_image_tokens(sample))
                rows["payload"].append(len(payload))
                rows["wire"].append(len(pack_moved(payload)))
            sets[name] = rows
    return sets


def noise_wire(rows: dict[str, list[int]], index: int) -> float:
    """A sample's wire bytes were its pixels noise: its text at the text ratio, the rest
    of its payload at :data:`NOISE_PIXEL_RATIO`."""
    text = TEXT_BYTES_PER_TOKEN * rows["length"][index]
    return TEXT_RATIO * text + NOISE_PIXEL_RATIO * max(0, rows["payload"][index] - text)


def cell(rows: dict[str, list[int]], world: int, per_rank: int, union_only: bool) -> dict:
    import odb_lightning.core.pool_plan as pool_plan
    from odb_lightning.core.locality import LEVEL_TOLERANCE

    rng = random.Random(world)
    drawn = [rng.randrange(len(rows["length"])) for _ in range(world * per_rank)]
    order = [drawn[i] for i in epoch_permutation(len(drawn), 0, 0)]
    lengths = [rows["length"][i] for i in order]
    payload = [rows["payload"][i] for i in order]
    pool_plan.LEVEL_TOLERANCE = -1.0 if union_only else LEVEL_TOLERANCE
    try:
        result = simulate_dealt_epoch(
            lengths, world, BatchingConfig.of(token_budget=BUDGET), sample_bytes=payload
        )
    finally:
        pool_plan.LEVEL_TOLERANCE = LEVEL_TOLERANCE
    moved = [p for rank in result.moved_positions for p in rank]
    rank_steps = world * len(result.steps[0])
    return {
        "world_size": world,
        "samples": len(order),
        "plan": "union" if union_only else "default",
        "steps_per_rank": len(result.steps[0]),
        "utilization": result.sync.utilization,
        "moved_samples": len(moved),
        "moved_payload_per_rank_step": sum(payload[p] for p in moved) / rank_steps,
        "moved_wire_per_rank_step": sum(rows["wire"][order[p]] for p in moved) / rank_steps,
        "moved_noise_wire_per_rank_step": sum(noise_wire(rows, order[p]) for p in moved)
        / rank_steps,
    }


def markdown(table: list[dict]) -> str:
    lines = [
        "| set | ranks | plan | utilization | steps / rank | moved samples "
        "| payload MiB / rank-step | wire MiB / rank-step (these pictures) "
        "| wire MiB / rank-step (noise pictures) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 1024 * 1024
    for r in table:
        lines.append(
            f"| {r['set']} | {r['world_size']} | {r['plan']} | {r['utilization']:.3f} | "
            f"{r['steps_per_rank']} | {r['moved_samples']:,} of {r['samples']:,} | "
            f"{r['moved_payload_per_rank_step'] / mib:.2f} | "
            f"{r['moved_wire_per_rank_step'] / mib:.3f} | "
            f"{r['moved_noise_wire_per_rank_step'] / mib:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", type=int, default=0, help="measure this many records a set")
    parser.add_argument("--worlds", default="8,64")
    parser.add_argument("--per-rank", type=int, default=1000, help="samples drawn per rank")
    args = parser.parse_args()
    if args.measure:
        SAMPLES.write_text(json.dumps(measure(args.measure)) + "\n")
    sets = json.loads(SAMPLES.read_text())
    table = []
    for world in (int(w) for w in args.worlds.split(",")):
        for name, rows in sets.items():
            for union_only in (True, False):
                table.append({"set": name} | cell(rows, world, args.per_rank, union_only))
                print(markdown(table[-1:]).splitlines()[-1], flush=True)
    RESULTS.write_text(json.dumps({"meta": results_meta(), "rows": table}, indent=2) + "\n")
    print(markdown(table))


if __name__ == "__main__":
    main()
