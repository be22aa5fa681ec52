"""Hydra nodes generated from the configuration dataclasses: each default is written once.

The dataclasses (their fields, defaults, docs under each field and checks in
``__post_init__``) are the only place a default lives.
:func:`~odb_lightning.core.nodes.node_of` turns one into a plain ``_target_`` node with
those defaults (Enums as their values, tuples as lists, nested dataclass defaults as nested
nodes), and :func:`register_configs` stores the nodes
in Hydra's ``ConfigStore`` before anything composes ``conf/train.yaml``. The YAML files
under ``conf/`` then hold presets only: the values that differ from the defaults.

Plain nodes rather than typed structured configs: the dataclasses validate themselves
(with messages naming the Hydra key), and some fields are unions OmegaConf cannot type
(``token_budget: int | str``).

Importing this module loads neither torch, Lightning nor transformers (``odb-check``
composes and validates a config in about a second): the configuration dataclasses live
in modules that import those where they are used, and the data and Lightning modules are
named by their ``_target_`` strings (:data:`MODULES`, checked against the classes by
``tests/unit/app/test_config_store.py``).
"""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore

from odb_lightning.app.run_dir import register_run_name_resolver
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES, Mode
from odb_lightning.core.nodes import node_of
from odb_lightning.data.config import DataCaches, DataSizes, DataSource
from odb_lightning.data.vision import ImageSettings, VisionTower
from odb_lightning.lit.callbacks.stop_settings import StopSettings
from odb_lightning.lit.model.config import Architecture, Finetuning, ModelRuntime, StepPolicy

MODULES = {
    "text_data": "odb_lightning.lit.data.datamodule.ODBDataModule",
    "image_text_data": "odb_lightning.lit.data.vlm_datamodule.VisionDataModule",
    "causal_lm": "odb_lightning.lit.model.module.CausalLMModule",
    "vision_language": "odb_lightning.lit.model.vlm_module.VisionLanguageModule",
}
"""The ``_target_`` of each data and Lightning module a generated node builds (strings:
their modules load torch and Lightning, which composing a config does not need)."""


def register_configs() -> None:
    """Store every generated node in Hydra's ``ConfigStore`` (call it before composing
    ``conf/train.yaml`` or ``conf/eval.yaml``; storing again replaces the same nodes)."""
    store = ConfigStore.instance()
    for group, name, node in _generated_nodes():
        store.store(group=group, name=name, node=node)


def batching_node(mode: Mode) -> dict[str, Any]:
    """The ``batching`` option of ``mode``: the defaults of :class:`BatchingConfig` with the
    mode's policy and row layout nodes whole, and the run's ``seed``."""
    return node_of(BatchingConfig, seed="${seed}", policy=mode.policy(), rows=mode.rows())


def model_node(vision: bool = False) -> dict[str, Any]:
    """The base ``model`` node of the text module (or, with ``vision``, the image-text
    module): its configuration concerns with their defaults. ``optimizer`` and
    ``scheduler`` are not generated: their values are ours, not the optimizer's defaults,
    and live in ``conf/model/tiny_qwen2.yaml``."""
    node: dict[str, Any] = {
        "_target_": MODULES["vision_language" if vision else "causal_lm"],
        "architecture": node_of(Architecture),
        "finetuning": node_of(Finetuning),
        "runtime": node_of(ModelRuntime),
        "step": node_of(StepPolicy),
    }
    if vision:
        node["vision"] = node_of(VisionTower)
    return node


CACHE_ROOT = "${paths.root_dir}/.cache/odb_lightning"
"""Where the generated data nodes keep the data's caches: beside the project, not in the
run directory, so every run shares them."""


def data_node(image: bool = False) -> dict[str, Any]:
    """The base ``data`` node of the text data module (or, with ``image``, the image-text
    one): its concerns with their defaults, the caches it uses under :data:`CACHE_ROOT`
    (streams for text, written sets for image-text data), and for image-text data the
    image settings."""
    caches = node_of(
        DataCaches,
        record_dir=f"{CACHE_ROOT}/records",
        length_dir=f"{CACHE_ROOT}/lengths",
        stream_dir=None if image else f"{CACHE_ROOT}/streams",
        image_set_dir=f"{CACHE_ROOT}/vlm_sets" if image else None,
    )
    node: dict[str, Any] = {
        "_target_": MODULES["image_text_data" if image else "text_data"],
        "source": node_of(DataSource),
        "sizes": node_of(DataSizes),
        "caches": caches,
    }
    if image:
        node["source"] = node_of(DataSource, name="llava")
        node["images"] = node_of(ImageSettings)
    else:
        node["streaming"] = False
        node["mixture"] = []
    return node


def _generated_nodes() -> list[tuple[str, str, dict[str, Any]]]:
    """``(group, option, node)`` of every generated config option."""
    batching = [("batching", mode.name, batching_node(mode)) for mode in MODES.values()]
    return [
        *batching,
        ("data", "chat", data_node()),
        ("data", "image_text", data_node(image=True)),
        ("model", "causal_lm", model_node()),
        ("model", "vision_language", model_node(vision=True)),
        ("stop", "default", node_of(StopSettings)),
    ]


def prepare_composition() -> None:
    """Everything ``conf/`` needs before Hydra composes it: the generated nodes and the
    run-directory resolvers (``${odb.run_name:...}``)."""
    register_configs()
    register_run_name_resolver()
