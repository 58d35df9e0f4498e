"""A small separator trained on the shipped samples, shipped with mtlab (``weights/``): load it, listen,
fine-tune it. ``scripts/train_pretrained_separator.py`` made it and prints its dev/test SI-SDR improvement.

>>> sep = load_pretrained()  # doctest: +SKIP
>>> round(pretrained_info()["dev_si_sdri"], 2)  # dB, as the script measured on the weights as stored
8.91
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..base.errors import ConfigError
from ..data import SeparationDataset
from .metrics import SeparationScores, score
from .runner import Separator, SeparatorConfig, build_separator
from .spectral import apply_masks

WEIGHTS = Path(__file__).resolve().parent / "weights" / "pit_blstm_clean.pt"
# Settings that fix the models' shapes: the saved ones are used, a different value is an error.
_SHAPE = ("loss", "hidden", "layers", "emb_dim", "mask_activation")


def _read(path: Path | str | None) -> dict[str, Any]:
    path = Path(path) if path is not None else WEIGHTS
    if not path.exists():
        raise ConfigError(f"no pretrained separator at {path}; make it with "
                          "python scripts/train_pretrained_separator.py")
    return torch.load(path, map_location="cpu", weights_only=True)


def pretrained_info(path: Path | str | None = None) -> dict[str, Any]:
    """What the file says about itself: its settings, steps, training seconds and dev/test SI-SDRi (dB)."""
    blob = _read(path)
    return {**blob["info"], "config": dict(blob["config"])}


def load_pretrained(linkedset: str = "clean", path: Path | str | None = None,
                    data: tuple[SeparationDataset, SeparationDataset] | None = None, **settings: Any) -> Separator:
    """A :class:`Separator` on ``linkedset`` whose models hold the pretrained weights (float32), ready to
    ``separate``, ``evaluate`` or fine-tune with ``step``. ``settings`` are :class:`SeparatorConfig` fields
    that do not change the models' shapes (lr, batch_size, remix, seed, ...)."""
    blob = _read(path)
    cfg = dict(blob["config"])
    clash = {k: settings[k] for k in _SHAPE if k in settings and settings[k] != cfg[k]}
    if clash:
        raise ConfigError(f"the pretrained separator was saved with {({k: cfg[k] for k in clash})}; "
                          f"drop {sorted(clash)} from the settings or train a new one")
    valid = set(SeparatorConfig.__dataclass_fields__)
    keep = {k: v for k, v in cfg.items() if k in valid and k not in ("loss", "linkedset", "root", "device")}
    sep = build_separator(cfg["loss"], linkedset, data=data, **{**keep, **settings})
    for name, model in sep.trainer.models.items():
        state = {k: v.float() if v.is_floating_point() else v for k, v in blob["models"][name].items()}
        model.load_state_dict(state)
    return sep


def ideal_mask_scores(sep: Separator, splits: tuple[str, ...] = ("dev", "test"), limit: int | None = None
                      ) -> dict[str, float]:
    """Mean SI-SDRi and SDRi (dB) of the ideal binary mask (each bin to the louder source) and the ideal ratio
    mask (``|S_k| / Σ_j |S_j|``) of each split, through the same reconstruction (mixture phase) as ``sep``'s
    estimates: what a mask-based separator could reach at best. Keys like ``test_ibm_si_sdri``."""
    out: dict[str, float] = {}
    for split in splits:
        data = sep.dataset(split)
        rows: dict[str, list[SeparationScores]] = {"ibm": [], "irm": []}
        for i in range(len(data) if limit is None else min(limit, len(data))):
            mix, refs = sep.waveforms(split, data.names[i])
            mags = data[i]["src_mag"]  # [T, F, S]
            masks = {"ibm": torch.nn.functional.one_hot(mags.argmax(-1), mags.shape[-1]).to(mags.dtype),
                     "irm": mags / mags.sum(-1, keepdim=True).clamp_min(1e-8)}
            for kind, m in masks.items():
                rows[kind].append(score(apply_masks(mix, m), refs, mix))
        for kind, scores in rows.items():
            out[f"{split}_{kind}_si_sdri"] = round(sum(s.row()["si_sdri"] for s in scores) / len(scores), 2)
            out[f"{split}_{kind}_sdri"] = round(sum(s.row()["sdri"] for s in scores) / len(scores), 2)
    return out


def save_pretrained(sep: Separator, path: Path | str, info: dict[str, Any]) -> Path:
    """Write ``sep``'s models (float16: half the bytes, a rounding far below what a listener hears) with
    its settings and ``info`` (plain numbers and strings)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in vars(sep.cfg).items() if isinstance(v, (str, int, float, bool))}
    models = {name: {k: v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()
                     for k, v in m.state_dict().items()}
              for name, m in sep.trainer.models.items()}
    torch.save({"config": cfg, "models": models, "info": dict(info)}, path)
    return path
