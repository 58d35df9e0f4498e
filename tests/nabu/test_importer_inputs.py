"""Several inputs of the same kind of data in one task: the original's enhancement recipes feed the mixture's
features and the features of an earlier experiment's reconstructions (``features``, ``recs1``, ``recs2``, each
an ``audio_feat_processor`` section) to the nodes of one graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.nabu import PROC, replace_in, write_recipe

from mtlab.base.errors import ConfigError
from mtlab.nabu import import_nabu, make_sample_root, plain_recipe
from mtlab.nabu.shrink import shrink

pytestmark = pytest.mark.usefixtures("one_thread")

TRAINER = """[trainer]
trainer = multi_task
tasks = task_enh
segment_lengths = full
num_epochs = 2
initial_learning_rate = 1e-3
learning_rate_decay = 1
clip_grad_value = 20000000
normalize_gradients = True
batch_size = 2
numbatches_to_aggregate = 1
numbuckets = 1
valid_frequency = 0
valid_adapt = False
go_back = False
num_tries = 3
reset_tries = True

[task_enh]
loss_type = pit
inputs = features recs1 recs2
outputs = bin_est
nodes = conc1 conc2 main1 main2 bin_est1 bin_est2 bin_est
conc1_model = concat
conc1_inputs = features recs1
main1_model = main
main1_inputs = conc1
bin_est1_model = outlayer
bin_est1_inputs = main1
conc2_model = concat
conc2_inputs = features recs2
main2_model = main
main2_inputs = conc2
bin_est2_model = outlayer
bin_est2_inputs = main2
bin_est_model = concat
bin_est_inputs = bin_est1 bin_est2
features = trainspec
recs1 = trainrecs1
recs2 = trainrecs2
targets = multi_targets mix_to_mask
multi_targets = trainmultitargets
mix_to_mask = trainmixtomask
"""

MODEL = """[hyper]
model_names = main outlayer concat

[main]
architecture = dblstm
num_units = 5
num_layers = 1
input_noise = 0.0
dropout = 1.0

[outlayer]
architecture = linear
output_dims = 129
input_noise = 0
dropout = 1.0

[concat]
architecture = concat
expand_dim_to_first_input = False False
"""

RECS = "/esat/spchtemp/experiments/DC/test/reconstructions/task_2spk_tr"


def write_enh_recipe(folder: Path) -> Path:
    folder = write_recipe(folder, **{"trainer.cfg": TRAINER, "model.cfg": MODEL, "loss.cfg": None,
                                     "validation_evaluator.cfg": None,
                                     "feature_processor.cfg": PROC.format(
                                         processor="audio_feat_processor", feature="logspec", winstep="0.008",
                                         energy="False", extra="mvn_type = local")})
    with (folder / "database.conf").open("a") as f:
        for k in (1, 2):
            f.write(f"\n[trainrecs{k}]\ndatafiles = {RECS}/s{k}.scp\nprocessor_config = feature_processor.cfg\n")
    return folder


def test_each_input_gets_its_own_data_key(tmp_path: Path) -> None:
    folder = write_enh_recipe(tmp_path / "ENH")
    recipe = import_nabu(folder, data_root=tmp_path / "data")
    task = recipe["tasks"]["task_enh"]
    assert task["inputs"] == ["features", "recs1", "recs2"]
    assert [n["inputs"] for n in task["nodes"][:2]] == [["features", "recs1"], ["features", "recs2"]]
    data = task["linkedsets"]["set0"]["data"]
    assert data["split"] == "tr" and data["mvn"] == "local"
    assert data["feature_inputs"] == {f"recs{k}": str(tmp_path / "data" / "spchtemp" / "experiments" / "DC" / "test"
                                                      / "reconstructions" / "task_2spk_tr" / f"s{k}.scp")
                                      for k in (1, 2)}
    assert recipe["models"]["main"]["input_dim"] == 2 * 129
    shrunk = import_nabu(folder, data_root=tmp_path / "data")
    shrink(shrunk, 4)  # the layer joined into the output by a concat keeps its size; the inputs' sizes are known
    assert shrunk["models"]["outlayer"]["units"] == [129] and shrunk["models"]["main"]["hidden"] == 4
    assert shrunk["models"]["main"]["input_dim"] == 2 * 129 and shrunk["models"]["outlayer"]["input_dim"] == 8
    # an input normalized otherwise than the mixture's features cannot share its statistics
    (folder / "recs_processor.cfg").write_text(PROC.format(processor="audio_feat_processor", feature="logspec",
                                                           winstep="0.008", energy="False", extra="mvn_type = None"))
    replace_in(folder, "database.conf", f"{RECS}/s2.scp\nprocessor_config = feature_processor.cfg",
               f"{RECS}/s2.scp\nprocessor_config = recs_processor.cfg")
    with pytest.raises(ConfigError, match=r"\[task_enh\] recs2: .*mvn"):
        import_nabu(folder, data_root=tmp_path / "data")


@pytest.mark.slow
def test_imported_graph_feeds_each_input_to_its_node(tmp_path: Path) -> None:
    """Oracle: the features of each list computed by hand and the graph built by hand from the same models."""
    import mtlab
    from mtlab.base.batching import collate
    from mtlab.data import features as F
    from mtlab.data import read_list, read_wav
    from mtlab.tasks.forward import eval_mode

    folder = write_enh_recipe(tmp_path / "ENH")
    recipe = import_nabu(folder, data_root=tmp_path / "data")
    make_sample_root(recipe, limit=4)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    data = recipe["tasks"]["task_enh"]["linkedsets"]["set0"]["data"]
    spectral = F.Spectral(**data["spectral"])
    ds = exp.trainer.tasks["task_enh"].linkedsets["set0"].examples
    names = ds.names[:2]
    recs = {key: read_list(path) for key, path in data["feature_inputs"].items()}
    mixes = read_list(Path(data["root"]) / "tr" / "mix_wav.scp")
    assert recs["recs1"][names[0]].resolve() != recs["recs2"][names[0]].resolve()

    def by_hand(path: Path) -> torch.Tensor:
        return F.local_mvn(F.log_magnitude(F.magnitude(read_wav(path), spectral)))

    models = exp.trainer.models
    plan = exp.trainer.plans["task_enh"]
    streamed = ds.featurize(collate([ds.audio(i) for i in range(2)]))  # the training path: features on the device
    for batch in (collate([ds[i] for i in range(2)]), streamed):
        with eval_mode(models), torch.no_grad():
            got = plan.loss(batch, keep_outputs=True).outputs["bin_est"]
            for j, name in enumerate(names):
                feats = by_hand(mixes[name].resolve())[None]
                lengths = torch.tensor([feats.shape[1]])
                est = []
                for key in ("recs1", "recs2"):
                    x = torch.cat([feats, by_hand(recs[key][name].resolve())[None]], dim=-1)
                    est.append(models["outlayer"](models["main"](x, seq_lengths=lengths)))
                want = torch.cat(est, dim=-1)[0]
                torch.testing.assert_close(got[j, :want.shape[0]], want, atol=2e-4, rtol=1e-3)
    exp.trainer.step()  # and it trains


def test_feature_inputs_the_loader_cannot_honour_are_errors(tmp_path: Path) -> None:
    from mtlab.data import DataError, data_samples_dir, load_split

    lists = {"recs1": str(data_samples_dir() / "train" / "s1.scp")}
    with pytest.raises(DataError, match=r"feature_inputs \['recs1'\] need stream=True.*mvn 'local'"):
        load_split(split="train", linkedset="clean", feature_inputs=lists, stream=True, mvn="global", progress=False)
    with pytest.raises(DataError, match=r"need stream=True"):
        load_split(split="train", linkedset="clean", feature_inputs=lists, stream=False, mvn="local")
    with pytest.raises(DataError, match=r"feature_inputs \['usedbins'\]: name them otherwise"):
        load_split(split="train", linkedset="clean", feature_inputs={"usedbins": lists["recs1"]}, stream=True,
                   mvn="local", progress=False)
    split = load_split(split="train", linkedset="clean", feature_inputs=lists, stream=True, mvn="none",
                       progress=False)
    assert split[0]["recs1"].shape == split[0]["features"].shape


def test_feature_inputs_survive_the_manifest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second load reads the parsed lists from the user cache: the other inputs' column must come back too."""
    from mtlab.data import data_samples_dir, load_split

    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    lists = {"recs1": str(data_samples_dir() / "train" / "s1.scp")}
    first = load_split(split="train", linkedset="clean", feature_inputs=lists, stream=True, mvn="none", progress=False)
    assert list((tmp_path / "cache" / "manifests").glob("*.npz")), "the first load caches the parsed lists"
    again = load_split(split="train", linkedset="clean", feature_inputs=lists, stream=True, mvn="none", progress=False)
    assert len(again.manifest.inputs) == 1
    assert again.manifest.inputs[0].path == first.manifest.inputs[0].path
    for i in (0, len(first) - 1):
        torch.testing.assert_close(again[i]["recs1"], first[i]["recs1"])
    # without the other input the same lists are another manifest (no input column)
    plain = load_split(split="train", linkedset="clean", stream=True, mvn="none", progress=False)
    assert plain.manifest.inputs == ()
