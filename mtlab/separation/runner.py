"""A one-task separation recipe on the shipped samples, and helpers to listen to the result.

Examples:
    >>> # ~5 min on one CPU thread
    >>> sep = train_separator(loss="pit", linkedset="clean", steps=600, seed=0)  # doctest: +SKIP
    >>> sep.evaluate()["si_sdri"].mean()          # dev SI-SDR improvement over the mixture, dB  # doctest: +SKIP
    >>> out = sep.separate(0)                      # numpy waveforms + sample rate  # doctest: +SKIP
    >>> audio_players(out)                         # IPython.display.Audio players (notebooks only)  # doctest: +SKIP

By default the training set is the corpus plus ``remix=5000`` mixtures remixed from its own training
sources (see ``remix.py``): on the 120 corpus mixtures alone the BLSTM memorizes and dev stays ~2 dB.
On a CPU shared with other work, ``torch.set_num_threads(1)`` is often several times faster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..base.batching import collate
from ..data import SAMPLE_RATE, SeparationDataset, data_samples_dir, load_split, read_list, read_wav
from ..data.features import USEDBINS_THRESHOLD_DB
from ..base.errors import ConfigError
from ..tasks.graph import Node
from ..training.loop import run
from ..models import BLSTM, DeepClusteringHead, MaskHead
from ..tasks.task import LinkedSet, LossComputer, Task
from ..core.events import Event, Payload
from ..core.trainer import Trainer
from .losses import PIT, DeepAttractorNet, DeepClustering, Direct
from .masks import attractor_masks, head_masks, kmeans_masks, power_ratio_masks
from .metrics import DEFAULT_METRICS, SeparationScores, score
from .remix import RemixedSet
from .spectral import apply_masks

if TYPE_CHECKING:
    import pandas as pd

METHODS = ("pit", "direct", "deepclustering", "deepattractornet")
TASK = "separation"
# Targets each loss reads from the batch.
_TARGETS = {
    "pit": ("src_mag", "mix_mag"),
    "direct": ("src_mag", "mix_mag"),
    "deepclustering": ("binary_targets", "usedbins"),
    "deepattractornet": ("src_mag", "mix_mag", "binary_targets", "usedbins"),
}


@dataclass
class SeparatorConfig:
    """Settings of :func:`build_separator` (defaults: the size the CPU benchmark uses)."""

    loss: str = "pit"
    linkedset: str = "clean"
    hidden: int = 128  # BLSTM units per direction
    layers: int = 2
    emb_dim: int = 20  # deep clustering / DANet embedding size D
    mask_activation: str = "sigmoid"  # the head's "sigmoid", or "softmax" over speakers (the original's)
    input_noise: float = 0.0  # std of Gaussian noise on the features, training only
    dropout: float = 0.0  # between BLSTM layers, training only
    remix: int = 5000  # extra training mixtures from pairs of training sources (0: the 120 corpus mixtures only)
    # train on a new mixture per example and epoch instead (mtlab.data.dynamic settings, e.g. {"gain_db": [-5, 5]})
    dynamic_mix: dict[str, Any] | None = None
    usedbins_db: float = USEDBINS_THRESHOLD_DB  # used bins: within this many dB of the utterance's loudest bin
    # the estimates' masks: None, the head's masks as they are; p, each to the power p over their sum
    # (masks.power_ratio_masks; 2: the power ratio). Training is unchanged: the loss reads the head's masks.
    mask_power: float | None = None
    lr: float = 1e-3
    batch_size: int = 8
    numbatches_to_aggregate: int = 1
    numbuckets: int = 4
    clip_grad_value: float | None = None
    seed: int = 0
    device: str = "auto"
    root: str | None = None  # data_samples folder (default: $MTLAB_DATA or the checkout's)

    def check(self) -> None:
        """Refuse settings a separator cannot use, naming the valid choices."""
        if self.loss not in METHODS:
            raise ConfigError(f"loss={self.loss!r} is not a separation loss; choose one of {METHODS}")
        if self.mask_power is not None and not self.mask_power > 0:
            raise ConfigError(f"mask_power must be > 0 (2: power-ratio masks) or None, got {self.mask_power!r}")


def build_models(cfg: SeparatorConfig, num_bins: int, num_sources: int) -> dict[str, torch.nn.Module]:
    """``{"blstm": BLSTM, "head": MaskHead | DeepClusteringHead}`` for ``cfg.loss``."""
    torch.manual_seed(cfg.seed)
    blstm = BLSTM(num_bins, cfg.hidden, num_layers=cfg.layers, dropout=cfg.dropout, input_noise=cfg.input_noise)
    if cfg.loss in ("pit", "direct"):
        head: torch.nn.Module = MaskHead(blstm.output_dim, num_bins, num_sources, activation=cfg.mask_activation)
    else:
        head = DeepClusteringHead(blstm.output_dim, num_bins, cfg.emb_dim, unit_norm=cfg.loss == "deepclustering")
    return {"blstm": blstm, "head": head}


def build_task(cfg: SeparatorConfig, train: SeparationDataset) -> Task:
    """The one separation task: features -> BLSTM -> head -> the chosen loss (on ``train``, plus
    ``cfg.remix`` remixed training mixtures)."""
    out = "masks" if cfg.loss in ("pit", "direct") else "emb"
    makers: dict[str, Callable[[], LossComputer]] = {
        "pit": lambda: PIT(output=out, activation="none"),  # the head already applies its activation
        "direct": lambda: Direct(output=out, activation="none"),
        "deepclustering": lambda: DeepClustering(output=out),
        "deepattractornet": lambda: DeepAttractorNet(output=out),
    }
    loss = makers[cfg.loss]()
    examples: Any = train
    if cfg.dynamic_mix is not None:
        examples = load_split(cfg.root, split="train", linkedset=cfg.linkedset, targets=_TARGETS[cfg.loss],
                              stats=train.stats, usedbins_threshold_db=cfg.usedbins_db, stream=True,
                              dynamic_mix={"seed": cfg.seed, **cfg.dynamic_mix}, progress=False)
    elif cfg.remix > 0:
        keys = ("features", *_TARGETS[cfg.loss])
        examples = RemixedSet(train, cfg.remix, cfg.linkedset, seed=cfg.seed, keys=keys, root=cfg.root,
                              usedbins_db=cfg.usedbins_db)
    return Task(TASK, nodes=[Node("h", "blstm", ["features"]), Node(out, "head", ["h"])], inputs=["features"],
                targets=list(_TARGETS[cfg.loss]), outputs=[out], loss=loss,
                linkedsets={cfg.linkedset: LinkedSet(examples)}, batch_size=cfg.batch_size, numbuckets=cfg.numbuckets)


@dataclass
class Separator:
    """A trainer with one separation task plus its data; ``step``, ``masks``, ``separate``, ``evaluate``."""

    cfg: SeparatorConfig
    trainer: Trainer
    train: SeparationDataset
    dev: SeparationDataset
    seconds: float = 0.0
    _waves: dict[tuple[str, str], tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)
    _splits: dict[str, SeparationDataset] = field(default_factory=dict, repr=False)

    @property
    def root(self) -> Path:
        return Path(self.cfg.root) if self.cfg.root is not None else data_samples_dir()

    def step(self, steps: int = 1, max_seconds: float | None = None,
             on_step: Callable[[Separator], None] | None = None, max_cpu_seconds: float | None = None) -> int:
        """Train ``steps`` steps through the training loop (stopping early after ``max_seconds`` of wall clock or
        ``max_cpu_seconds`` of this process's CPU time, which a busy machine does not shorten); returns the steps
        done. ``on_step(self)`` is called after each step."""
        start, cpu_start = time.perf_counter(), time.process_time()
        before = self.trainer.step_count

        def after_step(event: Event, info: Payload) -> None:
            if event == Event.STEP and on_step is not None:
                on_step(self)

        self.trainer.add_callback(after_step)
        try:
            run(self.trainer, steps=steps, progress=False,
                between_steps=lambda: (max_seconds is not None and time.perf_counter() - start >= max_seconds)
                or (max_cpu_seconds is not None and time.process_time() - cpu_start >= max_cpu_seconds))
        finally:
            self.trainer.remove_callback(after_step)
            self.seconds += time.perf_counter() - start
        return self.trainer.step_count - before

    def dataset(self, split: str) -> SeparationDataset:
        """The examples of ``split`` (other splits than train/dev loaded on first use, with the train stats)."""
        if split == "train":
            return self.train
        if split == "dev":
            return self.dev
        if split not in self._splits:
            self._splits[split] = in_memory(load_split(self.cfg.root, split=split, linkedset=self.cfg.linkedset,
                                                       stats=self.train.stats))
        return self._splits[split]

    @torch.no_grad()
    def masks(self, examples: Sequence[dict[str, Tensor]], batch_size: int = 8) -> list[Tensor]:
        """Masks ``[T, F, S]`` (CPU, unpadded) for each example, in eval mode, as the head gives them (the
        estimates of ``separate`` and ``evaluate`` use ``power_ratio_masks(m, cfg.mask_power)``)."""
        tr = self.trainer
        plan = tr.plans[TASK]
        out_name = plan.task.outputs[0]
        s = examples[0]["src_mag"].shape[-1] if "src_mag" in examples[0] else 2
        previous = {k: model.training for k, model in tr.models.items()}
        for model in tr.models.values():
            model.eval()
        result: list[Tensor] = []
        try:
            for i in range(0, len(examples), batch_size):
                chunk = examples[i:i + batch_size]
                data, lens = collate([{"features": e["features"], "usedbins": e["usedbins"]} for e in chunk])
                data = {k: v.to(tr.device) for k, v in data.items()}
                lengths = lens["features"].to(tr.device)
                out = plan.forward((data, lens)).outputs[out_name]
                f = data["features"].shape[-1]
                if self.cfg.loss in ("pit", "direct"):
                    m = head_masks(out, f, lengths)
                else:
                    m, centroids = kmeans_masks(out, data["usedbins"], lengths, s, seed=self.cfg.seed + i)
                    if self.cfg.loss == "deepattractornet":
                        m = attractor_masks(out, centroids, lengths)
                result += [m[j, : int(n)].cpu() for j, n in enumerate(lens["features"])]
        finally:
            for k, model in tr.models.items():
                model.train(previous[k])
        return result

    def waveforms(self, split: str, name: str) -> tuple[Tensor, Tensor]:
        """``(mixture [N], sources [S, N])`` of utterance ``name`` as float32 tensors."""
        key = (split, name)
        if key not in self._waves:
            folder = self.root / split
            mix = read_list(folder / f"mix_{self.cfg.linkedset}.scp")[name]
            srcs = [read_list(folder / f"s{k}.scp")[name] for k in (1, 2)]
            self._waves[key] = (read_wav(mix.resolve(), origin=mix.where),
                                torch.stack([read_wav(e.resolve(), origin=e.where) for e in srcs]))
        return self._waves[key]

    def separate(self, index: int | str = 0, split: str = "dev") -> dict[str, Any]:
        """Separate one utterance (index or name), the estimates through ``cfg.mask_power``'s masks: numpy
        ``mixture [N]``, ``estimates [S, N]`` (in the references' order), ``references [S, N]``, ``sample_rate``, ``name`` and ``scores`` (dB, means
        over the sources)."""
        data = self.dataset(split)
        if isinstance(index, str) and index not in data.names:
            raise ConfigError(f"no utterance {index!r} in {split}; names look like {data.names[:2]}")
        i = data.names.index(index) if isinstance(index, str) else int(index)
        name = data.names[i]
        mix, refs = self.waveforms(split, name)
        est = apply_masks(mix, power_ratio_masks(self.masks([data[i]])[0], self.cfg.mask_power))
        sc = score(est, refs, mix)
        return {"name": name, "sample_rate": SAMPLE_RATE, "mixture": mix.numpy(),
                "estimates": est[list(sc.perm)].numpy(), "references": refs.numpy(), "scores": sc.row()}

    def evaluate(self, split: str = "dev", limit: int | None = None,
                 metrics: Sequence[str] = DEFAULT_METRICS) -> pd.DataFrame:
        """One row per utterance: ``metrics`` (default SI-SDR, SDR, SNR) of the estimates and of the mixture,
        and the improvements ``si_sdri``, ``sdri``, ... (dB, mean over the speakers). ``metrics=("si_sdr",)``
        skips BSS-eval's SDR, the costly one."""
        import pandas as pd

        data = self.dataset(split)
        n = len(data) if limit is None else min(limit, len(data))
        masks = self.masks([data[i] for i in range(n)])
        rows = []
        for i in range(n):
            mix, refs = self.waveforms(split, data.names[i])
            sc: SeparationScores = score(apply_masks(mix, power_ratio_masks(masks[i], self.cfg.mask_power)), refs, mix,
                                         metrics=metrics)
            rows.append({"name": data.names[i], **sc.row()})
        return pd.DataFrame(rows)


def load_data(linkedset: str = "clean", root: str | None = None, usedbins_db: float = USEDBINS_THRESHOLD_DB
              ) -> tuple[SeparationDataset, SeparationDataset]:
    """``(train, dev)`` of a linked set, dev normalized with the train statistics (load once, reuse
    for several separators with ``build_separator(..., data=...)`` and the same ``usedbins_db``)."""
    train = in_memory(load_split(root, split="train", linkedset=linkedset, usedbins_threshold_db=usedbins_db))
    dev = in_memory(load_split(root, split="dev", linkedset=linkedset, stats=train.stats,
                               usedbins_threshold_db=usedbins_db))
    return train, dev


def in_memory(data: object) -> SeparationDataset:
    """``load_split(...)`` without ``stream=`` as what it is, an in-memory :class:`SeparationDataset`."""
    if not isinstance(data, SeparationDataset):
        raise ConfigError(f"a separator trains on the in-memory corpus of load_split(stream=False), got "
                          f"{type(data).__name__}")
    return data


def build_separator(loss: str = "pit", linkedset: str = "clean",
                    data: tuple[SeparationDataset, SeparationDataset] | None = None, **settings: Any) -> Separator:
    """A :class:`Separator` (untrained) for ``loss`` in ``METHODS`` on a linked set of the samples.
    ``data`` = ``load_data(linkedset)`` to skip loading; ``settings`` are :class:`SeparatorConfig` fields."""
    valid = set(SeparatorConfig.__dataclass_fields__)
    unknown = sorted(set(settings) - valid)
    if unknown:
        raise ConfigError(f"unknown separator settings {unknown}; valid: {sorted(valid - {'loss', 'linkedset'})}")
    cfg = SeparatorConfig(loss=loss, linkedset=linkedset, **settings)
    cfg.check()
    train, dev = data if data is not None else load_data(linkedset, cfg.root, cfg.usedbins_db)
    if train.linkedset != linkedset or dev.linkedset != linkedset:
        raise ConfigError(f"data holds linked set {train.linkedset!r}/{dev.linkedset!r}, not {linkedset!r}; "
                          f"pass data=load_data({linkedset!r})")
    num_bins = int(train[0]["features"].shape[-1])
    models = build_models(cfg, num_bins, int(train[0]["src_mag"].shape[-1]))
    trainer = Trainer(models, [build_task(cfg, train)], lr=cfg.lr, clip_grad_value=cfg.clip_grad_value,
                      numbatches_to_aggregate=cfg.numbatches_to_aggregate, device=cfg.device, seed=cfg.seed)
    return Separator(cfg, trainer, train, dev)


def train_separator(loss: str = "pit", linkedset: str = "clean", steps: int = 200, seed: int = 0,
                    max_seconds: float | None = None, on_step: Callable[[Separator], None] | None = None,
                    data: tuple[SeparationDataset, SeparationDataset] | None = None, **settings: Any) -> Separator:
    """Build a separator and train it ``steps`` steps (or until ``max_seconds``)."""
    sep = build_separator(loss, linkedset, data=data, seed=seed, **settings)
    sep.step(steps, max_seconds=max_seconds, on_step=on_step)
    return sep


def audio_players(result: dict[str, Any]) -> dict[str, Any]:
    """``IPython.display.Audio`` players for the mixture, each estimate and each reference of
    ``Separator.separate(...)`` (needs the ``notebook`` extra)."""
    try:
        from IPython.display import Audio
    except ImportError as exc:
        raise ImportError("audio_players needs IPython; install it with pip install 'mtlab[notebook]'") from exc
    rate = result["sample_rate"]
    players = {"mixture": Audio(np.asarray(result["mixture"]), rate=rate)}
    for s, (est, ref) in enumerate(zip(result["estimates"], result["references"]), start=1):
        players[f"estimate {s}"] = Audio(np.asarray(est), rate=rate)
        players[f"reference {s}"] = Audio(np.asarray(ref), rate=rate)
    return players
