"""A tiny corpus cut from data_samples/ and a small TOML recipe that trains on it."""

from __future__ import annotations

from pathlib import Path

from helpers.paths import DATA_SAMPLES as SAMPLES


def make_tiny_corpus(root: Path, sizes: dict[str, int] | None = None) -> Path:
    """A few utterances of data_samples/ with absolute-path lists (loads in about a second)."""
    sizes = sizes or {"train": 8, "dev": 4}
    for split, n in sizes.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        for name in ("mix_clean.scp", "mix_noisy.scp", "s1.scp", "s2.scp", "spk.txt"):
            lines = (SAMPLES / split / name).read_text().splitlines()[:n]
            if name.endswith(".scp"):
                lines = [f"{k} {(SAMPLES / split / v).resolve()}" for k, v in (ln.split() for ln in lines)]
            (root / split / name).write_text("\n".join(lines) + "\n")
    (root / "speakers.tsv").write_text((SAMPLES / "speakers.tsv").read_text())
    return root


TINY_TOML = """\
name = "tiny"

[trainer]
num_steps = {num_steps}
initial_learning_rate = 0.01
learning_rate_decay = 0.5
clip_grad_value = 1.0
batch_size = 3
numbatches_to_aggregate = 1
numbuckets = 2
valid_frequency = {valid_frequency}
go_back = true
valid_adapt = true
num_tries = 3
nonfinite = "skip"
device = "cpu"

[models.enc]
type = "BLSTM"
input_dim = 129
hidden = 4
input_noise = 0.1

[models.pool]
type = "MeanPool"

[models.spk_head]
type = "Linear"
in_features = 8
out_features = 10

[models.frame_head]
type = "Linear"
in_features = 8
out_features = 3

[tasks.spk]
inputs = ["features"]
targets = ["spk"]
outputs = ["logits"]
nodes = [
    {{ name = "h", model = "enc", inputs = ["features"] }},
    {{ name = "pooled", model = "pool", inputs = ["h"] }},
    {{ name = "logits", model = "spk_head", inputs = ["pooled"] }},
]
loss = {{ type = "crossentropy", output = "logits", target = "spk" }}

[tasks.spk.linkedsets.clean]
weight = 1.0
data = {{ root = "{root}", split = "train", linkedset = "clean" }}
valid = {{ split = "dev" }}

[tasks.frames]
inputs = ["features"]
targets = ["frame_target"]
outputs = ["logits"]
nodes = [
    {{ name = "h", model = "enc", inputs = ["features"] }},
    {{ name = "logits", model = "frame_head", inputs = ["h"] }},
]
loss = {{ type = "crossentropy", output = "logits", target = "frame_target" }}

[tasks.frames.linkedsets.clean]
weight = 1.0
data = {{ root = "{root}", split = "train", linkedset = "clean" }}
valid = {{ split = "dev" }}

[tasks.frames.linkedsets.noisy]
weight = 0.5
data = {{ root = "{root}", split = "train", linkedset = "noisy" }}
valid = {{ split = "dev" }}
"""


def write_tiny_recipe(path: Path, root: Path, num_steps: int = 6, valid_frequency: int = 2) -> Path:
    path.write_text(TINY_TOML.format(root=root, num_steps=num_steps, valid_frequency=valid_frequency))
    return path
