"""Recipe folders with i-vector inputs in the original's formats."""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------- a recipe folder in the original's formats
PROC = """[processor]
processor = {processor}
feature = {feature}
winlen = 0.032
winstep = 0.008
winfunc = cosine
nfft = 256
preemph = 0.0
include_energy = False
{extra}
"""


TASK = """loss_type = deepclustering
inputs = features ivecs
outputs = bin_emb
nodes = n0 n1 bin_emb
n0_model = concat
n0_inputs = features ivecs
n1_model = main
n1_inputs = n0
bin_emb_model = outlayer
bin_emb_inputs = n1
features = {split}spec
ivecs = {split}ivec
targets = binary_targets usedbins
binary_targets = {split}targets
usedbins = {split}usedbins
"""


TRAINER = """[trainer]
trainer = multi_task
tasks = task_2spk
segment_lengths = 40 full
num_epochs = 1
initial_learning_rate = 1e-3
learning_rate_decay = 1
clip_grad_value = 20000000
normalize_gradients = True
batch_size = 4 2
numbatches_to_aggregate = 1
numbuckets = 1
valid_frequency = 5
valid_adapt = False
go_back = False
num_tries = 3
reset_tries = True

[task_2spk]
""" + TASK.format(split="train")


VALID = """[evaluator]
evaluator = task_loss_evaluator
requested_utts = 4
batch_size = 2

[task_2spk]
""" + TASK.format(split="dev")


MODEL = """[hyper]
model_names = main outlayer concat

[main]
architecture = dblstm
num_units = 6
num_layers = 1
input_noise = 0.0
dropout = 1.0

[outlayer]
architecture = linear
output_dims = 2580
input_noise = 0
dropout = 1.0

[concat]
architecture = concat
expand_dim_to_first_input = False True
input_noise = 0.2 0.2
"""


ROOT = "/esat/corpora/wsjMix/data/2speakers/wav8k/min"


SECTIONS = {"spec": ("mix_wav.scp", "feature_processor.cfg"), "targets": ("allS_wav.scp", "target_processor.cfg"),
            "usedbins": ("mix_wav.scp", "usedbins_processor.cfg"), "ivec": ("utt_ivec5info.txt", "ivec_processor.cfg")}


def write_ivec_recipe(folder: Path, ivec_root: str = ROOT, **overrides: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    db = []
    for split, sub in (("train", "tr"), ("dev", "cv")):
        for name, (listing, proc) in SECTIONS.items():
            root = ivec_root if name == "ivec" else ROOT
            db += [f"[{split}{name}]", f"datafiles = {root}/{sub}/{listing}",
                   f"processor_config = config/recipes/mine/{folder.name}/{proc}", ""]
    files = {
        "trainer.cfg": TRAINER, "validation_evaluator.cfg": VALID, "model.cfg": MODEL, "database.conf": "\n".join(db),
        "loss.cfg": "[deepclustering]\nloss_type = deepclustering\n",
        "feature_processor.cfg": PROC.format(processor="audio_feat_processor", feature="logspec",
                                             extra="mvn_type = global"),
        "target_processor.cfg": PROC.format(processor="onehotperfeature_target_processor", feature="magspec",
                                            extra="nrs = 2"),
        "usedbins_processor.cfg": PROC.format(processor="scorelabelperfeature_processor", feature="magspec",
                                              extra="mag_thres = 100"),
        "ivec_processor.cfg": PROC.format(processor="matrix2vector_processor", feature="logspec",
                                          extra="nrcol = 5\nnrs = 2\nmvn_type = global"),
    }
    files.update(overrides)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder
