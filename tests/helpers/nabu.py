"""Small recipe folders in the original's (Nabu-MSSS) formats, written for the importer's tests."""

from __future__ import annotations

from pathlib import Path

PROC = """[processor]
processor = {processor}
feature = {feature}
winlen = 0.032
winstep = {winstep}
winfunc = cosine
nfft = 256
preemph = 0.0
include_energy = {energy}
{extra}
"""


TRAINER = """[trainer]
#The type of trainer
trainer = multi_task
tasks = task_dc task_pit
segment_lengths = 100 full
num_epochs = 10
initial_learning_rate = 1e-3 5e-4
learning_rate_decay = 1 0.5
clip_grad_value = 20000000
normalize_gradients = True
batch_size = 4 2
numbatches_to_aggregate = 2 1
numbuckets = 1
valid_frequency = 5
valid_adapt = False
go_back = True
num_tries = {num_tries}
reset_tries = True
task_weights = 1 0.5
acc_steps = True
normalize_weights_acc_steps = True
init_file = /models/previous/network.ckpt

[task_dc]
loss_type = deepclustering
inputs = features
outputs = bin_emb
nodes = n0 bin_emb
n0_model = main
n0_inputs = features
bin_emb_model = outlayer
bin_emb_inputs = n0
features = trainspec
targets = binary_targets usedbins
binary_targets = traintargets
usedbins = trainusedbins
trainset_frac = 0.5

[task_pit]
loss_type = pit_sig
inputs = features
outputs = bin_est
nodes = n0 hidden cat bin_est
n0_model = main
n0_inputs = features
hidden_model = ff
hidden_inputs = features
cat_model = concat
cat_inputs = n0 hidden
bin_est_model = pitlayer
bin_est_inputs = cat
linkedsets = clean noisy
linkedset_weighting = 2 1
targets = multi_targets mix_to_mask
clean_features = trainspec
clean_multi_targets = trainmultitargets
clean_mix_to_mask = trainmixtomask
noisy_features = trainspec_noisy
noisy_multi_targets = trainmultitargets_noisy
noisy_mix_to_mask = trainmixtomask_noisy
"""


MODEL = """[hyper]
model_names = main outlayer ff concat pitlayer

[main]
architecture = dblstm
num_units = 8
num_layers = 2
input_noise = 0.2 0.2
dropout = 0.9
recurrent_dropout = 1.0
layer_norm = False

[outlayer]
architecture = linear
output_dims = 129 3
input_noise = 0
dropout = 1.0

[ff]
architecture = feedforward
num_units = 6
num_layers = 2
input_noise = 0
dropout = 1.0

[concat]
architecture = concat
expand_dim_to_first_input = False False

[pitlayer]
architecture = linear
output_dims = 258
input_noise = 0
dropout = 1.0
"""


LOSS = """[deepclustering]
loss_type = deepclustering

[pit_sig]
loss_type = pit
activation = sigmoid
"""


VALID = """[evaluator]
evaluator = task_loss_evaluator
requested_utts = 50
batch_size = 10

[task_dc]
loss_type = deepclustering
inputs = features
outputs = bin_emb
nodes = n0 bin_emb
n0_model = main
n0_inputs = features
bin_emb_model = outlayer
bin_emb_inputs = n0
features = devspec
targets = binary_targets usedbins
binary_targets = devtargets
usedbins = devusedbins

[task_pit]
requested_utts = 20
loss_type = pit_sig
inputs = features
outputs = bin_est
nodes = n0 hidden cat bin_est
n0_model = main
n0_inputs = features
hidden_model = ff
hidden_inputs = features
cat_model = concat
cat_inputs = n0 hidden
bin_est_model = pitlayer
bin_est_inputs = cat
targets = multi_targets mix_to_mask
features = devspec
multi_targets = devmultitargets
mix_to_mask = devmixtomask
"""


SECTIONS = {  # section: (list folder, list file, processor config)
    "trainspec": ("tr", "mix_wav.scp", "feature_processor.cfg"),
    "traintargets": ("tr", "allS_wav.scp", "target_processor.cfg"),
    "trainusedbins": ("tr", "mix_wav.scp", "usedbins_processor.cfg"),
    "trainmultitargets": ("tr", "allS_wav.scp", "multitarget_processor.cfg"),
    "trainmixtomask": ("tr", "mix_wav.scp", "mixtomask_processor.cfg"),
    "trainspec_noisy": ("tr", "mix_noisy.scp", "feature_processor.cfg"),
    "trainmultitargets_noisy": ("tr", "allS_wav.scp", "multitarget_processor.cfg"),
    "trainmixtomask_noisy": ("tr", "mix_noisy.scp", "mixtomask_processor.cfg"),
    "devspec": ("cv", "mix_wav.scp", "feature_processor.cfg"),
    "devtargets": ("cv", "allS_wav.scp", "target_processor.cfg"),
    "devusedbins": ("cv", "mix_wav.scp", "usedbins_processor.cfg"),
    "devmultitargets": ("cv", "allS_wav.scp", "multitarget_processor.cfg"),
    "devmixtomask": ("cv", "mix_wav.scp", "mixtomask_processor.cfg"),
}


ORIGINAL_ROOT = "/esat/corpora/wsjMix/data/2speakers/wav8k/min"


def write_recipe(folder: Path, num_tries: str = "3", **overrides: str) -> Path:
    """A recipe folder in the original's formats; ``overrides`` replace whole files by name."""
    folder.mkdir(parents=True, exist_ok=True)
    db = ["[globalvars]", "segment_lengths = 100 full", "meanandvar_dir = /esat/features/train", ""]
    for name, (split, listing, proc) in SECTIONS.items():
        db += [f"[{name}]", f"datafiles = {ORIGINAL_ROOT}/{split}/{listing}", "preprocess = True",
               f"store_dir = /esat/features/{name}", "meanandvar_dir = globalvars",
               f"processor_config = config/recipes/mine/{folder.name}/{proc}",
               "segment_lengths = globalvars", "meta_info = False", "optional = False", ""]
    db += ["[testspec3spk]", "datafiles = /esat/corpora/wsjMix/data/3speakers/wav8k/min/tt/mix_wav.scp",
           "processor_config = feature_processor.cfg", ""]
    files = {
        "trainer.cfg": TRAINER.format(num_tries=num_tries), "model.cfg": MODEL, "loss.cfg": LOSS,
        "validation_evaluator.cfg": VALID, "database.conf": "\n".join(db),
        "feature_processor.cfg": PROC.format(processor="audio_feat_processor", feature="logspec", winstep="0.008",
                                             energy="False", extra="mvn_type = global"),
        "target_processor.cfg": PROC.format(processor="onehotperfeature_target_processor", feature="magspec",
                                            winstep="0.008", energy="False", extra="nrs = 2"),
        "usedbins_processor.cfg": PROC.format(processor="scorelabelperfeature_processor", feature="magspec",
                                              winstep="0.008", energy="False", extra="mag_thres = 100"),
        "multitarget_processor.cfg": PROC.format(processor="multi_target_processor", feature="magspec",
                                                 winstep="0.008", energy="False", extra="nrs = 2"),
        "mixtomask_processor.cfg": PROC.format(processor="audio_signal_processor", feature="magspec",
                                               winstep="0.008", energy="False", extra=""),
        "test_evaluator.cfg": "[evaluator]\nevaluator = multi_task\ntasks = task_dc\n",
    }
    files.update(overrides)
    for name, text in files.items():
        if text is None:
            (folder / name).unlink(missing_ok=True)
        else:
            (folder / name).write_text(text)
    return folder


# ---------------------------------------------------------------- what mtlab cannot honour
def replace_in(folder: Path, file: str, old: str, new: str) -> None:
    path = folder / file
    text = path.read_text()
    assert old in text, (file, old)
    path.write_text(text.replace(old, new, 1))


TEST_EVALUATOR = """[evaluator]
evaluator = multi_task
tasks = task_dc task_pit
segment_length = full

[task_dc]
requested_utts = 3
batch_size = 2
loss_type = deepclustering
evaluator = task_loss_evaluator
inputs = features
outputs = bin_emb
nodes = n0 bin_emb
n0_model = main
n0_inputs = features
bin_emb_model = outlayer
bin_emb_inputs = n0
features = testspec
targets = binary_targets usedbins
binary_targets = testtargets
usedbins = testusedbins

[task_pit]
requested_utts = 2
batch_size = 2
loss_type = pit_sig
evaluator = task_loss_evaluator
inputs = features
outputs = bin_est
nodes = n0 hidden cat bin_est
n0_model = main
n0_inputs = features
hidden_model = ff
hidden_inputs = features
cat_model = concat
cat_inputs = n0 hidden
bin_est_model = pitlayer
bin_est_inputs = cat
targets = multi_targets mix_to_mask
features = testspec
multi_targets = testmultitargets
mix_to_mask = testmixtomask
"""


RECONSTRUCTOR = """[task_dc]
reconstruct_type = deepclustering
org_mix = testorgmix
usedbins = testusedbins
nrs = 2
store_output = False

[task_pit]
reconstruct_type = stackedmasks
org_mix = testorgmix
nrs = 2
activation = sigmoid
store_output = True
"""


SCORER = """[task_dc]
score_type = sdr
org_src = testorgsrc
base = testbase
spkinfo = testspkinfo

[task_pit]
score_type = sdr
org_src = testorgsrc
base = testbase
spkinfo = testspkinfo
"""


REC_PROC = """[processor]
processor = audio_signal_processor
feature = spec
winlen = 0.032
winstep = 0.008
winfunc = cosine
nfft = 256
"""


def write_test_recipe(folder: Path) -> Path:
    folder = write_recipe(folder, **{"test_evaluator.cfg": TEST_EVALUATOR, "reconstructor.cfg": RECONSTRUCTOR,
                                     "scorer.cfg": SCORER, "rec_processor.cfg": REC_PROC})
    root = "/esat/corpora/wsjMix/data/2speakers/wav8k/min/tt"
    extra = []
    for name, (_, listing, proc) in SECTIONS.items():
        if name.startswith("dev") and name != "devspec" or name == "devspec":
            test = "test" + name[3:]
            extra += [f"[{test}]", f"datafiles = {root}/{listing}", f"processor_config = {proc}", ""]
    extra += ["[testorgmix]", f"datafiles = {root}/mix_wav.scp", "processor_config = rec_processor.cfg", "",
              "[testorgsrc]", f"datafiles = {root}/allS_wav.scp", "", "[testbase]", f"datafiles = {root}/mix_wav.scp",
              "", "[testspkinfo]", f"datafiles = {root}/utt_spkinfo.txt", ""]
    with (folder / "database.conf").open("a") as f:
        f.write("\n" + "\n".join(extra))
    replace_in(folder, "trainer.cfg", "init_file = /models/previous/network.ckpt", "")
    replace_in(folder, "trainer.cfg", "valid_frequency = 5", "valid_frequency = 0")  # keep the run short
    return folder


TASK = """[task_2spk]
loss_type = deepclustering_flat
inputs = features
outputs = bin_emb
nodes = n0 n1 n2 n3 bin_emb
n0_model = main
n0_inputs = features
n1_model = aux_lstm
n1_inputs = features
n2_model = concat
n2_inputs = n0 n1
n3_model = feedforward
n3_inputs = n2
bin_emb_model = outlayer
bin_emb_inputs = n3
features = {split}spec
targets = binary_targets usedbins
binary_targets = {split}targets
usedbins = {split}usedbins
"""
