"""loss.cfg and the task's loss_type as mtlab loss tables: the original's loss types mtlab has, their fixed
output and target names mapped through the task's data keys, and the options mtlab honours."""

from __future__ import annotations

from collections.abc import Mapping
from configparser import ConfigParser
from typing import Any

from ..base.errors import ConfigError
from .ini import SpecReader, section

# The original's loss types mtlab has (same math, mtlab.separation.losses / mtlab.losses), with the
# fixed output and target names the original's loss computers read, mapped to mtlab's settings.
LOSS_NAMES: dict[str, dict[str, str]] = {
    "deepclustering": {"output": "bin_emb", "target": "binary_targets", "usedbins": "usedbins"},
    "deepclustering_flat": {"output": "bin_emb", "target": "binary_targets", "usedbins": "usedbins"},
    "pit": {"output": "bin_est", "target": "multi_targets", "mixture": "mix_to_mask"},
    "direct": {"output": "bin_est", "target": "multi_targets", "mixture": "mix_to_mask"},
    "deepattractornet": {"output": "bin_emb", "target": "multi_targets", "partition": "binary_targets",
                         "mixture": "mix_to_mask", "usedbins": "usedbins"},
    "crossentropy_multi": {"output": "spkest", "target": "spkids"},
    "crossentropy": {"output": "spkest", "target": "spkids"},
    "dummy": {}, "dummy_loss": {},  # zero loss, normalizer 1: the speaker-verification test tasks' loss
    "deepclusteringnoise": {"output": "bin_emb", "noise_filter": "noise_filter", "target": "binary_targets",
                            "usedbins": "usedbins", "noisybins": "noisybins", "ratio": "rel_speech_targets"},
}
# loss.cfg options per loss type: option -> how it maps (None: only its default value can be honoured).
LOSS_OPTIONS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "pit": {"activation": ("softmax", "sigmoid", "none", "None"), "no_perm": ("True", "False"),
            "logits_name": (), "rescale_recs": ("False",), "overspeakerized": ("False",), "transpose_order": None},
    "deepattractornet": {"activation": ("softmax", "sigmoid", "none", "None"), "frame_based": ("False", "false")},
    "crossentropy_multi": {"allow_permutation": ("True", "False"), "resh_logits": ("True", "true", "False", "false"),
                           "av_anchors_time_flag": ("False", "false")},
}
# Every loss_type the original's loss_computer_factory knows (a name outside it failed there too).
ORIGINAL_LOSS_TYPES = frozenset("""deepclustering deepclustering_flat deepclustering_2and3spk pit deepattractornet
anchor_deepattractornet anchor_deepattractornet_softmax anchor_normdeepattractornet_softmax
weighted_anchor_normdeepattractornet_softmax time_anchor_deepattractornet_softmax
time_anchor_normdeepattractornet_softmax time_anchor_read_heads_normdeepattractornet_softmax
time_anchor_read_heads_normdeepattractornet_softmax_framebased l41 pit_l41 deepclustering_l1
intravar2centervar_rat dist2mean_rat dist2mean_rat_squared dist2mean_rat_fracbins dist2mean_closest_rat
dist2mean_epsilon_closest_rat direct crossentropy crossentropy_multi dc_pit
deepclustering_full_crossentropy_multi_reshapelogits_avtime deepclusteringnoise deepattractornetnoisehard
deepattractornetnoisesoft noisefilter deepattractornet_noisefilter pit_noise deepclusteringnoise_rat_as_weight
deepclusteringnoise_alpha_as_weight deepclusteringnoise_snr_target deepclusteringnoise_dconly
deepclusteringnoise_noiseonly deepclustering_diar msl dummy_loss dummy""".split())



def loss_options(imp: SpecReader, task: str, loss_type: str, losses: ConfigParser | None) -> tuple[str, dict[str, str]]:
    """(the loss type, its loss.cfg options): loss.cfg's section named by the task's loss_type."""
    if losses is None:
        return loss_type, {}
    path = imp.folder / "loss.cfg"
    if not losses.has_section(loss_type):
        raise ConfigError(f"{path}: no [{loss_type}] section for task {task!r} (the original looks up the "
                          "task's loss_type there when loss.cfg exists)")
    options = section(losses, loss_type, path)
    if "loss_type" not in options:
        raise ConfigError(f"{path}: [{loss_type}] needs loss_type")
    return options.pop("loss_type"), options


def loss_spec(imp: SpecReader, task: str, kind: str, options: Mapping[str, str],
              keys: Mapping[str, str]) -> dict[str, Any] | None:
    """The mtlab loss table: the original's fixed names mapped through the task's data keys."""
    file = "loss.cfg" if options else "trainer.cfg"
    if kind not in LOSS_NAMES:
        why = "has no mtlab implementation" if kind in ORIGINAL_LOSS_TYPES else \
            "is not a loss type of the original either (its factory rejects it; without loss.cfg the task's " \
            "loss_type is the type itself)"
        imp.refuse(file, f"[{task}] loss_type", f"{kind!r} {why} (mtlab has {', '.join(LOSS_NAMES)})")
        return None
    allowed = LOSS_OPTIONS.get(kind, {})
    for key, value in options.items():
        choices = allowed.get(key, ())
        if key not in allowed:
            imp.refuse(file, f"[{kind}] {key}", f"not an option of the original's {kind!r} loss that mtlab "
                                                 f"honours (it honours {', '.join(allowed) or 'none'})")
        elif choices is None:
            imp.refuse(file, f"[{kind}] {key}", "mtlab's loss has no such option")
        elif choices and value not in choices:
            imp.refuse(file, f"[{kind}] {key}", f"{value!r}: mtlab honours {', '.join(choices)}")
    names = dict(LOSS_NAMES[kind])
    if "logits_name" in options:
        names["output"] = options["logits_name"]
    spec: dict[str, Any] = {"type": kind}
    for setting, original in names.items():
        if setting in ("output", "noise_filter"):
            spec[setting] = original
        elif original in keys:
            spec[setting] = keys[original]
        else:
            imp.refuse("trainer.cfg", f"[{task}] targets", f"the original's {kind!r} loss reads target "
                                                            f"{original!r}, which the task does not give")
    if kind in ("pit", "direct"):
        spec["layout"] = "speaker_major"  # the original reads flat logits speaker-major
    if kind == "deepattractornet" and "activation" not in options:
        imp.refuse(file, f"[{kind}] activation", "the original's deepattractornet loss requires it")
    if "activation" in options:
        spec["activation"] = options["activation"].lower()
    if options.get("no_perm") == "True":
        spec["no_perm"] = True
    if "allow_permutation" in options:
        spec["allow_permutation"] = options["allow_permutation"] == "True"
    return spec
