"""model.cfg's ``capsnet`` as an :class:`mtlab.models.CapsNet` spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..base.errors import ConfigError

if TYPE_CHECKING:
    from .importer import Importer

KEYS = frozenset({"architecture", "num_capsules", "capsule_dim", "routing_iters", "num_layers", "logits_prior",
                  "input_noise", "dropout", "trainable"})
# Keys the original reads with self.conf[key] (a KeyError there when missing).
REQUIRED = ("num_capsules", "capsule_dim", "routing_iters", "num_layers", "input_noise", "dropout")


def capsnet_spec(imp: Importer, where: str, conf: Mapping[str, str], input_dims: list[int | None]
                 ) -> tuple[dict[str, Any], int | None]:
    """(CapsNet spec, output size per frame) of one ``capsnet`` section."""
    file = "model.cfg"
    path = imp.folder / file
    for key in conf:
        if key not in KEYS:
            raise imp.unknown(file, where, key, sorted(KEYS))
    for key in REQUIRED:
        if key not in conf:
            raise ConfigError(f"{path}: {where} needs {key!r} for architecture 'capsnet' (the original reads it)")
    if len(input_dims) != 1:
        raise ConfigError(f"{path}: {where} architecture 'capsnet' reads one input (the original raises otherwise), "
                          f"its nodes give {len(input_dims)}")
    if conf.get("trainable", "True") != "True":
        imp.refuse(file, f"{where} trainable", "frozen models: mtlab trains every model a task uses")
    num_capsules = imp.value(file, f"{where} num_capsules", "int", conf["num_capsules"])
    capsule_dim = imp.value(file, f"{where} capsule_dim", "int", conf["capsule_dim"])
    keep = imp.value(file, f"{where} dropout", "float", conf["dropout"])
    if not 0 < keep <= 1:
        raise ConfigError(f"{path}: {where} dropout = {keep}: a keep probability in (0, 1]")
    spec: dict[str, Any] = {
        "type": "CapsNet", "input_dim": input_dims[0], "num_capsules": num_capsules, "capsule_dim": capsule_dim,
        "num_layers": imp.value(file, f"{where} num_layers", "int", conf["num_layers"]),
        "routing_iters": imp.value(file, f"{where} routing_iters", "int", conf["routing_iters"]),
        # the original: anything but 'True' is False
        "logits_prior": conf.get("logits_prior", "False") == "True",
        "input_noise": imp.value(file, f"{where} input_noise", "float", conf["input_noise"]),
        "dropout": 1.0 - keep}
    if input_dims[0] is None:
        imp.refuse(file, where, "the size of its input is unknown (it comes from data or a model mtlab cannot build)")
    return spec, num_capsules * capsule_dim
