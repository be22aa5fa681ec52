"""``odb-plan`` CLI: its JSON matches the core planners, inputs load, errors are clear."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

from odb_lightning.app.plan import build_parser, main
from odb_lightning.core.buckets import bucket_table, optimize_boundaries, predict_efficiency
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES
from odb_lightning.core.online_policy import ShardDealing
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import summarize_plan
from odb_lightning.core.policy import BucketedPolicy, StandardPolicy
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch, simulate_epoch

ALL_MODES = "standard,sorted,bucketed,oracle,odb,odb_packed"


def _run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _expected_stats(lengths, mode, budget, edges, *, seed=0, batch_size=8, window=8192, cap=64):
    batches = plan_epoch(
        lengths,
        mode=mode,
        token_budget=budget,
        batch_size=batch_size,
        max_batch_size=cap if mode == "bucketed" else None,
        boundaries=edges,
        outstanding_depth=window,
        seed=seed,
    )
    rows = MODES[mode].rows()
    return dataclasses.asdict(summarize_plan(lengths, batches, budget, rows=rows))


def test_synthetic_json_matches_the_core_planners(capsys):
    argv = ["--synthetic", "1456,0.54,1500", "--budget", "16384", "--budget", "8192,32768"]
    result = _run_json(capsys, *argv, "--modes", ALL_MODES, "--window", "128", "--seed", "3")
    lengths = lognormal_lengths(1500, 1456, 0.54, seed=3)
    assert result["lengths"]["n"] == 1500
    assert result["lengths"]["mean"] == pytest.approx(sum(lengths) / 1500)
    assert [b["token_budget"] for b in result["budgets"]] == [16384, 8192, 32768]
    for report in result["budgets"]:
        budget = report["token_budget"]
        edges = optimize_boundaries(lengths, 6, token_budget=budget, max_batch_size=64)
        assert report["buckets"]["boundaries"] == edges
        assert report["buckets"]["predicted_efficiency"] == pytest.approx(
            predict_efficiency(lengths, edges, token_budget=budget, max_batch_size=64)
        )
        rows = bucket_table(lengths, edges, token_budget=budget, max_batch_size=64, seed=3)
        assert report["buckets"]["table"] == [dataclasses.asdict(r) for r in rows]
        for mode in ALL_MODES.split(","):
            expected = _expected_stats(lengths, mode, budget, edges, seed=3, window=128)
            assert report["modes"][mode] == pytest.approx(expected)
        assert report["comparison"] == {
            name: report["modes"][name]["padding_efficiency"]
            for name in ("sorted", "standard", "bucketed")
        }
        stats = report["modes"]
        assert stats["oracle"]["padding_efficiency"] > stats["bucketed"]["padding_efficiency"]
        assert stats["bucketed"]["padding_efficiency"] > stats["standard"]["padding_efficiency"]
        assert stats["odb"]["over_budget_batches"] == 0


@pytest.mark.parametrize("kind", ["text", "npy", "length_cache"])
def test_lengths_file_gives_the_same_plan(tmp_path, capsys, kind):
    lengths = lognormal_lengths(400, 900, 0.8, seed=1)
    if kind == "length_cache":  # the file a training run's length pass writes
        from odb_lightning.data import LengthCache, TokenizedDataset, length_fingerprint

        dataset = TokenizedDataset([(list(range(1, n + 1)), None) for n in lengths])
        parts = {"source": "test"}
        cache = LengthCache(tmp_path / "cache")
        fingerprint = length_fingerprint(**parts)
        path = cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False).path
    elif kind == "npy":
        path = tmp_path / "lengths.npy"
        np.save(path, np.array(lengths, dtype=np.int32))
    else:
        path = tmp_path / "lengths.txt"
        # One per line and whitespace-separated both parse.
        path.write_text("\n".join(" ".join(map(str, lengths[i : i + 7])) for i in range(0, 400, 7)))
    edges = [0, 600, 1200, max(lengths) + 1]
    argv = ["--lengths", str(path), "--modes", "sorted,bucketed", "--batch-size", "4"]
    result = _run_json(capsys, *argv, "--boundaries", ",".join(map(str, edges)))
    report = result["budgets"][0]
    assert report["token_budget"] == 16384
    assert report["buckets"]["boundaries"] == edges and not report["buckets"]["optimized"]
    for mode in ("sorted", "bucketed"):
        expected = _expected_stats(lengths, mode, 16384, edges, batch_size=4)
        assert report["modes"][mode] == pytest.approx(expected)


def test_max_seq_len_truncates_file_lengths(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("100\n5000\n300\n")
    result = _run_json(capsys, "--lengths", str(path), "--max-seq-len", "1000", "--modes", "oracle")
    assert result["lengths"]["max"] == 1000
    assert result["budgets"][0]["modes"]["oracle"]["real_tokens"] == 1400


def test_human_output_has_tables_and_comparison(capsys):
    argv = ["--synthetic", "1456,0.54,800", "--boundaries", "0,770,1216,1728,2432,3296,8192"]
    assert main([*argv, "--max-seq-len", "8191"]) == 0
    out = capsys.readouterr().out
    for text in ("token_budget = 16384", "standard", "oracle", "odb", "[3296, 8192)"):
        assert text in out
    assert "comparison: sorted" in out and "random (standard)" in out and "/ bucketed" in out


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("12 x 5", ".txt", "entry 1 is not an integer"),
        ("12 0 5", ".txt", r"lengths\[1\]"),
        ("", ".txt", "no lengths"),
        (None, ".npy", "dtype float64"),
    ],
)
def test_bad_lengths_file_is_a_clear_error(tmp_path, capsys, content, suffix, message):
    path = tmp_path / f"lengths{suffix}"
    if content is None:
        np.save(path, np.array([1.5, 2.0]))
    else:
        path.write_text(content)
    assert main(["--lengths", str(path), "--modes", "oracle"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("odb-plan: error:")
    assert re.search(message, err)


def test_boundaries_below_the_longest_sample_is_a_clear_error(capsys):
    argv = ["--synthetic", "1456,0.54,500", "--modes", "bucketed", "--boundaries", "0,1000,2000"]
    assert main(argv) == 2
    assert "must exceed the longest sample" in capsys.readouterr().err


def test_missing_data_layer_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "odb_lightning.data.lengths", None)
    assert main(["--source", "sharegpt"]) == 2
    assert "odb_lightning.data.lengths" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--synthetic", "1456,0.54"],
        ["--synthetic", "1456,0.54,100", "--modes", "fancy"],
        ["--synthetic", "1456,0.54,100", "--budget", "16k"],
        ["--modes", "oracle"],
    ],
)
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: odb-plan" in capsys.readouterr().err


def test_module_entry_point_and_console_script():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("odb-plan") == "odb_lightning.app.plan:main"
    argv = ["--synthetic", "1000,0.5,300", "--modes", "oracle", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "odb_lightning.app.plan", *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    report = json.loads(done.stdout)["budgets"][0]["modes"]["oracle"]
    lengths = lognormal_lengths(300, 1000, 0.5, seed=0)
    assert report["real_tokens"] == sum(lengths)


def test_ranks_scores_odb_by_its_slowest_rank(tmp_path, capsys) -> None:
    lengths = lognormal_lengths(3000, 900.0, 0.8, seed=5, max_len=4096)
    np.save(path := tmp_path / "lengths.npy", np.array(lengths))
    result = _run_json(capsys, "--lengths", str(path), "--modes", "odb", "--ranks", "4")
    ranks = result["budgets"][0]["ranks"]
    config = BatchingConfig.of(token_budget=16384)
    order = epoch_permutation(len(lengths), 0, 0)
    ordered = [lengths[i] for i in order]
    expected = simulate_dealt_epoch(ordered, 4, config)
    assert ranks["world_size"] == 4 and ranks["shard_dealing"] == "by_need"
    assert ranks["steps_per_rank"] == len(expected.steps[0])
    assert ranks["sync_efficiency"] == pytest.approx(expected.sync.sync_efficiency)
    assert ranks["utilization"] == pytest.approx(expected.sync.utilization)
    assert 0 < ranks["utilization"] <= ranks["sync_efficiency"] <= 1
    oracle = len(plan_epoch(lengths, mode="oracle", token_budget=16384)) / 4
    assert ranks["steps_vs_oracle"] == pytest.approx(ranks["steps_per_rank"] / oracle)
    assert ranks["idle_fraction"] <= 0.05
    fixed = _run_json(
        capsys, "--lengths", str(path), "--modes", "odb", "--ranks", "4", "--dealing", "fixed"
    )["budgets"][0]["ranks"]
    expected = simulate_epoch([ordered[r::4] for r in range(4)], config)
    assert fixed["shard_dealing"] == "fixed"
    assert fixed["utilization"] == pytest.approx(expected.sync.utilization)


def test_batching_options_come_from_the_policy_fields():
    args = build_parser().parse_args(["--synthetic", "1000,0.5,10"])
    assert args.batch_size == StandardPolicy().batch_size
    assert args.num_buckets == BucketedPolicy().num_buckets
    assert args.max_batch_size == BucketedPolicy().max_batch_size
    assert args.outstanding_depth is None and args.shard_dealing is None  # the config's
    for dealing in ShardDealing:  # the choices are the enum's values
        given = build_parser().parse_args(["--synthetic", "1000,0.5,10", "--dealing", dealing])
        assert given.shard_dealing == dealing.value
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--synthetic", "1000,0.5,10", "--dealing", "round_robin"])


def test_ranks_with_cross_rank_grouping_take_its_threshold(tmp_path, capsys) -> None:
    lengths = lognormal_lengths(6000, 900.0, 1.0, seed=5, max_len=4096)
    np.save(path := tmp_path / "lengths.npy", np.array(lengths))
    base = ["--lengths", str(path), "--modes", "odb", "--ranks", "4", "--budget", "8192"]
    ordered = [lengths[i] for i in epoch_permutation(len(lengths), 0, 0)]
    for below in (0.97, 1.0):
        argv = [*base, "--cross-rank", "--pool-below-sync", str(below)]
        ranks = _run_json(capsys, *argv)["budgets"][0]["ranks"]
        config = BatchingConfig.of(
            token_budget=8192, cross_rank_grouping=True, pool_below_sync=below
        )
        expected = simulate_dealt_epoch(ordered, 4, config)
        assert ranks["pool_below_sync"] == below and ranks["cross_rank_grouping"]
        assert ranks["steps_per_rank"] == len(expected.steps[0])
        assert ranks["moved_samples"] == sum(expected.moved_samples) > 0
        rank_steps = 4 * ranks["steps_per_rank"]
        assert ranks["moved_samples_per_rank_step"] == ranks["moved_samples"] / rank_steps
        # A byte a token: the simulator's moved bytes are the moved samples' tokens.
        tokens = sum(simulate_dealt_epoch(ordered, 4, config, sample_bytes=ordered).moved_bytes)
        assert ranks["moved_tokens_per_rank_step"] * rank_steps == pytest.approx(tokens)
        assert ranks["moved_samples"] <= tokens < sum(ordered)
    # Without the flag the defaults group across ranks; --no-cross-rank turns it off.
    assert _run_json(capsys, *base)["budgets"][0]["ranks"]["cross_rank_grouping"]
    alone = _run_json(capsys, *base, "--no-cross-rank")["budgets"][0]["ranks"]
    plain = simulate_dealt_epoch(
        ordered, 4, BatchingConfig.of(token_budget=8192, cross_rank_grouping=False)
    )
    assert not alone["cross_rank_grouping"] and alone["moved_samples"] == 0
    assert alone["steps_per_rank"] == len(plain.steps[0])
