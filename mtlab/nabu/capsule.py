"""model.cfg's ``capsnet`` and ``dbr_capsnet`` as :class:`mtlab.models.CapsNet` and ``DBRCapsNet`` specs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base.errors import ConfigError
from .ini import SpecReader

KEYS = frozenset({"architecture", "num_capsules", "capsule_dim", "routing_iters", "num_layers", "logits_prior",
                  "input_noise", "dropout", "trainable"})
# Keys the original reads with self.conf[key] (a KeyError there when missing).
REQUIRED = ("num_capsules", "capsule_dim", "routing_iters", "num_layers", "input_noise", "dropout")


def capsnet_spec(imp: SpecReader, where: str, conf: Mapping[str, str], input_dims: list[int | None]
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


DBR_KEYS = KEYS | {"rec_only_vote", "recurrent_probability_fn", "accumulate_input_logits", "accumulate_state_logits"}
# Keys some recipes hold that the original's dbr_capsnet never reads (a misspelling of accumulate_input_logits).
DBR_UNREAD = ("accumulate_inputs_logits",)


def dbr_capsnet_spec(imp: SpecReader, where: str, conf: Mapping[str, str], input_dims: list[int | None]
                     ) -> tuple[dict[str, Any], int | None]:
    """(DBRCapsNet spec, output size per frame) of one ``dbr_capsnet`` section."""
    file = "model.cfg"
    path = imp.folder / file
    for key in conf:
        if key not in DBR_KEYS and key not in DBR_UNREAD:
            raise imp.unknown(file, where, key, sorted(DBR_KEYS))
        if key in DBR_UNREAD:
            imp.defaults.append(f"{where} {key}: the original's dbr_capsnet never reads it (it reads "
                                "accumulate_input_logits), so the input logits accumulate, its default, as there")
    plain = {k: v for k, v in conf.items() if k in KEYS}
    spec, out = capsnet_spec(imp, where, plain, input_dims)
    probability = conf.get("recurrent_probability_fn", "sigmoid")  # absent: the cell's default, sigmoid
    if probability not in ("sigmoid", "unit"):
        raise ConfigError(f"{path}: {where} recurrent_probability_fn = {probability!r}: the original's dbr_capsnet "
                          "knows sigmoid and unit")
    spec.update(type="DBRCapsNet", rec_only_vote=conf.get("rec_only_vote", "False") == "True",
                recurrent_probability=probability,
                # only 'False' switches accumulation off in the original
                accumulate_input_logits=conf.get("accumulate_input_logits", "True") != "False",
                accumulate_state_logits=conf.get("accumulate_state_logits", "True") != "False")
    return spec, None if out is None else 2 * out
