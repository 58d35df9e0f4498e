"""Smaller models for a quick look at an original recipe: hidden sizes capped, the sizes that follow fixed.

``mtlab train RECIPE_DIR --shrink 32`` and ``scripts/nabu_survey.py --train --shrink 32`` use it; a full-size
recipe can take minutes per step on a few CPU cores.
"""

from __future__ import annotations

from typing import Any

from ..base.errors import ConfigError

RECURRENT = ("BLSTM", "ResetBLSTM", "ResetBLSTMInsert", "LeakyBLSTM", "BRNN")
KNOWN = (*RECURRENT, "Dense", "Constant", "Concat", "EncoderDecoderCNN", "Attractor", "CapsNet", "DBRCapsNet")


def shrink(recipe: dict[str, Any], cap: int) -> None:
    """Cap hidden sizes (BLSTM units, Dense layers that are no task output) at ``cap`` (a CNN's channels at
    ``cap // 4``, its kernels at 3 x 3; a CapsNet's capsules at ``cap // 4`` of at most 4 dimensions) and fix the
    input sizes that follow from them, walking each task's graph as the importer does."""
    if cap < 1:
        raise ConfigError(f"--shrink {cap}: the cap on hidden sizes must be at least 1")
    other = sorted({m["type"] for m in recipe["models"].values()} - set(KNOWN))
    if other:
        raise ConfigError(f"--shrink caps the model types of original Nabu-MSSS recipes ({', '.join(KNOWN)}); "
                          f"this recipe also has {other}: set their sizes in the recipe instead")
    outputs = {o for task in recipe["tasks"].values() for o in task["outputs"]}
    for task in recipe["tasks"].values():  # a node a Concat joins into an output sizes that output too
        for node in reversed(task["nodes"]):
            kind = recipe["models"][node["model"]]["type"]
            if node["name"] in outputs and kind == "Concat":
                outputs.update(node["inputs"])
            if kind == "Attractor":  # its embeddings keep their bins x embedding size
                outputs.update(node["inputs"][:1])
    for task in recipe["tasks"].values():
        data = next(iter(task["linkedsets"].values()))["data"]
        known = {"features": data.get("spectral", {}).get("n_fft", 256) // 2 + 1}
        known.update({k: known["features"] for k in data.get("feature_inputs", {})})
        known.update(usedbins=known["features"], binary_targets=known["features"] * data.get("num_sources", 2))
        if "ivec" in data:
            known["ivec"] = data["ivec"]["nrcol"] * data["ivec"]["nrs"]
        first = recipe["models"][task["nodes"][0]["model"]].get("input_dim")
        sizes = {k: known.get(k, first) for k in task["inputs"]}
        for node in task["nodes"]:
            spec = recipe["models"][node["model"]]
            dims = [sizes.get(i) for i in node["inputs"]]
            if "input_dim" in spec and dims[0] is not None:
                spec["input_dim"] = dims[0]
            if spec["type"] in RECURRENT:
                spec["hidden"] = min(spec["hidden"], cap)
                out = 2 * spec["hidden"]
            elif spec["type"] == "Dense":
                if node["name"] not in outputs:
                    spec["units"] = [min(u, cap) for u in spec["units"]]
                out = spec.get("output_shape", spec["units"])[-1]
            elif spec["type"] == "Constant":
                out = spec["shape"][-1]
            elif spec["type"] == "EncoderDecoderCNN":
                # a channel spans every bin (129 units per frame) and each kernel tap costs as much again:
                # channels are capped at a quarter of the cap and kernels at 3 x 3
                channels = max(1, cap // 4)
                spec["filters"] = [min(f, channels) for f in spec["filters"]]
                if node["name"] not in outputs:
                    spec["output_filters"] = min(spec["output_filters"], channels)
                for key in ("kernels", "centre_kernel"):
                    if key in spec:
                        spec[key] = [min(k, 3) for k in spec[key]] if key == "centre_kernel" else \
                            [[min(k, 3) for k in pair] for pair in spec[key]]
                out = spec["output_filters"]
            elif spec["type"] in ("CapsNet", "DBRCapsNet"):
                # routing costs num_capsules^2 * capsule_dim^2 per frame and layer: cap // 4 capsules of at most
                # 4 dimensions keep num_capsules * capsule_dim within the cap
                spec["num_capsules"] = min(spec["num_capsules"], max(1, cap // 4))
                spec["capsule_dim"] = min(spec["capsule_dim"], 4)
                out = spec["num_capsules"] * spec["capsule_dim"] * (2 if spec["type"] == "DBRCapsNet" else 1)
            elif spec["type"] == "Attractor":
                out = dims[0] // spec["bins"] if dims[0] is not None else None
            else:  # Concat
                out = sum(d for d in dims if d is not None)
            sizes[node["name"]] = out
