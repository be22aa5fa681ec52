"""Jobs on a real one-node SLURM cluster (``.ci/slurm/start.sh``): the sbatch example on 2
CPU tasks, a job stopped by SLURM's SIGUSR1 that requeues itself and resumes exactly, and a
two-point sweep through Hydra's submitit launcher (``launcher=slurm``) whose points land in
the printed sweep directory with its table, one of them stopped by the same signal and
resumed exactly.

The signal is sent as SLURM sends ``--signal=USR1@<s>`` before the time limit (to every
process of the job's steps): ``scancel --signal=USR1``, while the ranks are held at a step
boundary (``testing/harness/pause.py``), so no test races the end of training.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.train_run import read_audit

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 420.0
RECORDS = list(range(80))  # debug=smoke with data.sizes.val_samples=0: all 80 records train
SMOKE = ("debug=smoke", "audit_ids=true", "data.sizes.val_samples=0")
PAUSE = "+callbacks.pause._target_=testing.harness.pause.PauseAtStep"
ON_CPUS = ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0")

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def wait_for(check: Callable[[], object], what: str, timeout_s: float = JOB_TIMEOUT_S) -> object:
    """Poll ``check`` until it returns something true; fail naming ``what`` at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout_s}s")


def job_fields(job: str) -> dict[str, str]:
    """``scontrol show job``'s fields of ``job`` (kept MinJobAge after it ends)."""
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True
    )
    return dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_job_end(job: str) -> dict[str, str]:
    return wait_for(  # type: ignore[return-value]
        lambda: (f := job_fields(job))["JobState"] in FINAL and f, f"SLURM job {job} to end"
    )


def sbatch(script: str, out: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Submit ``examples/<script>`` from the repository root (the job sees this process's
    environment and ``env``); the job id."""
    command = ["sbatch", "--parsable", f"--output={out}", "--time=15"]
    options = [a for a in args if a.startswith("--")]
    overrides = [a for a in args if not a.startswith("--")]
    done = subprocess.run(
        [*command, *options, f"examples/{script}", *overrides],
        cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def signal_when_paused(
    job: str,
    pause: Path,
    ranks: int,
    log: Path,
    alive: Callable[[], bool] = lambda: True,
    name: str = "USR1",
) -> None:
    """Once every rank waits at the pause: SIG<name> to the job's steps, as SLURM's
    ``--signal`` sends it, then, once a rank said it received it, let the ranks go."""
    wait_for(
        lambda: alive() and len(list(pause.glob("paused.rank*"))) == ranks,
        f"{ranks} ranks paused",
    )
    subprocess.run(["scancel", f"--signal={name}", job], check=True)
    wait_for(
        lambda: f"received SIG{name}: stopping after this step" in read_log(log),
        f"a rank to receive SIG{name}",
    )
    (pause / "go").write_text("")


def read_log(path: Path) -> str:
    """A job's output: its tasks write into one file, so a character may be cut."""
    return path.read_text(errors="replace") if path.exists() else ""


def every_record_once(run_dir: Path) -> None:
    trained = Counter(i for rank in read_audit(run_dir, 2) for step in rank for i in step)
    assert trained == Counter(RECORDS), "every record trained once over every attempt"


def test_the_sbatch_example_trains_on_two_cpu_tasks(tmp_path: Path) -> None:
    """examples/slurm_2nodes.sbatch as one node of 2 CPU tasks: DDP over srun's tasks
    (Lightning's SLURMEnvironment), one run directory, every record once."""
    out, run_dir = tmp_path / "slurm.out", tmp_path / "run"
    job = sbatch(
        "slurm_2nodes.sbatch", out, *ON_CPUS,
        "trainer=ddp_cpu", "trainer.num_nodes=1", *SMOKE, f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    fields = wait_job_end(job)
    log = read_log(out)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["emitted_samples"] == len(RECORDS)
    every_record_once(run_dir)


def test_a_job_stopped_by_slurms_signal_requeues_and_resumes_exactly(tmp_path: Path) -> None:
    """SIGUSR1 (``--signal=USR1@...`` before the time limit) to a 2-task job: both ranks
    stop after the same step and save, rank 0 requeues the job, and the requeued attempt
    (same job id, SLURM_RESTART_COUNT 1) resumes in the same directory with ckpt_path=auto:
    every record trained once over the two attempts."""
    out, run_dir, pause = tmp_path / "slurm.out", tmp_path / "run", tmp_path / "pause"
    job = sbatch(
        "slurm_2nodes.sbatch", out, *ON_CPUS, "trainer=ddp_cpu", "trainer.num_nodes=1",
        *SMOKE, f"hydra.run.dir={run_dir}", PAUSE, "+callbacks.pause.step=3",
        f"+callbacks.pause.directory={pause}",
    )  # fmt: skip
    signal_when_paused(job, pause, 2, out)
    fields = wait_for(
        lambda: (f := job_fields(job))["Restarts"] == "1" and f["JobState"] in FINAL and f,
        "the requeued attempt to end",
    )
    log = read_log(out)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]  # type: ignore[index]
    assert f"requeued SLURM job {job}" in log
    assert "stopping on SIGUSR1 after optimizer step 3" in log
    assert "Traceback" not in log, log[-4000:]
    assert sorted(p.name for p in run_dir.glob(".hydra_attempt-*")) != []
    every_record_once(run_dir)


def test_torchrun_under_srun_survives_the_signal_and_resumes_exactly(tmp_path: Path) -> None:
    """examples/slurm_torchrun.sbatch (one torchrun agent, 2 workers): SLURM's SIGUSR1 to
    the step reaches the agent too, which ignores it (it died of it, and --kill-on-bad-exit
    then cut the workers' save short); the workers stop, save, rank 0 requeues, and the
    requeued attempt resumes exactly."""
    out, run_dir, pause = tmp_path / "slurm.out", tmp_path / "run", tmp_path / "pause"
    one_agent = ("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=0")
    job = sbatch(
        "slurm_torchrun.sbatch", out, *one_agent, "trainer=ddp_cpu", *SMOKE,
        f"hydra.run.dir={run_dir}", PAUSE, "+callbacks.pause.step=3",
        f"+callbacks.pause.directory={pause}", env={"NPROC_PER_NODE": "2"},
    )  # fmt: skip
    signal_when_paused(job, pause, 2, out)
    fields = wait_for(
        lambda: (f := job_fields(job))["Restarts"] == "1" and f["JobState"] in FINAL and f,
        "the requeued attempt to end",
    )
    log = read_log(out)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]  # type: ignore[index]
    assert "User defined signal 1" not in log, log[-4000:]
    assert f"requeued SLURM job {job}" in log
    every_record_once(run_dir)


LAUNCHERS = {
    # Our preset: SIGUSR1 before the time limit.
    "USR1": ("launcher=slurm",),
    # submitit's own: SIGUSR2 before the limit, whose handler ran in the loader processes
    # too and killed the run; our stop takes it (ckpt_path=auto given by hand here).
    "USR2": ("hydra/launcher=submitit_slurm", "hydra.launcher.tasks_per_node=2", "ckpt_path=auto"),
}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_a_submitit_sweep_lands_in_its_printed_directory_and_a_stopped_point_resumes(
    tmp_path: Path, name: str
) -> None:
    """``python train.py -m launcher=slurm``: two points (array tasks of 2 CPU ranks each),
    both in the sweep directory the launcher printed, with the sweep table; point 0 gets
    the time-limit signal mid-epoch (ours, SIGUSR1; or submitit's, SIGUSR2), stops,
    requeues itself and resumes: every record once."""
    pause_of = "${hydra:runtime.output_dir}/pause"
    command = [
        sys.executable, str(ROOT / "train.py"), "-m", *LAUNCHERS[name], "trainer=ddp_cpu",
        *SMOKE, "seed=1,2", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=15",
        PAUSE, "+callbacks.pause.step=3", f"+callbacks.pause.directory='{pause_of}'",
    ]  # fmt: skip
    log = tmp_path / "launcher.log"
    # The jobs inherit this environment (sbatch's default): the pause callback is found.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("w") as output:
        launcher = subprocess.Popen(command, cwd=tmp_path, stdout=output, stderr=output, env=env)

    def running() -> bool:
        if launcher.poll() is not None:
            pytest.fail(f"the sweep ended early ({launcher.returncode}): {read_log(log)[-3000:]}")
        return True

    try:
        printed = wait_for(
            lambda: re.search(r"sweep output dir : (\S+)", read_log(log)), "the sweep dir"
        )
        sweep_dir = Path(printed.group(1))  # type: ignore[union-attr]
        (sweep_dir / "1" / "pause").mkdir(parents=True, exist_ok=True)
        (sweep_dir / "1" / "pause" / "go").write_text("")  # point 1 runs through
        array = wait_for(lambda: next((sweep_dir / ".submitit").glob("*_0"), None), "point 0's job")
        job = array.name  # type: ignore[union-attr]
        point_log = array / f"{job}_0_log.err"  # type: ignore[operator]
        signal_when_paused(job, sweep_dir / "0" / "pause", 2, point_log, running, name)
        launcher.wait(timeout=JOB_TIMEOUT_S)
    finally:
        launcher.kill()
        launcher.wait()
    text = read_log(log)
    assert launcher.returncode == 0, text[-4000:]
    assert sweep_dir.is_absolute() and sweep_dir.is_relative_to(tmp_path)
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == ["0", "1"]
    assert not list(tmp_path.glob("outputs/train/slurm-*")), "no point anywhere else"
    with (sweep_dir / "summary_table.csv").open() as rows:
        table = list(csv.DictReader(rows))
    assert [(row["job"], row["seed"], row["status"]) for row in table] == [
        ("0", "1", "ok"), ("1", "2", "ok"),
    ]  # fmt: skip
    assert len(list((sweep_dir / "0").glob(".hydra_attempt-*"))) == 2  # stopped, resumed
    assert len(list((sweep_dir / "1").glob(".hydra_attempt-*"))) == 1
    for point in ("0", "1"):
        every_record_once(sweep_dir / point)
    point = read_log(point_log)
    assert "A temporary saved file already exists" not in point
    assert "Caught signal" not in point, "submitit's handler ran"
    # The SIGTERM SLURM sends after the requeue meets our handlers, not those of before.
    assert "Bypassing signal SIGTERM" not in point
    assert f"stopping on SIG{name} after optimizer step 3" in point
