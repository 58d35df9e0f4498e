"""lhotse CutSets of the sample corpus's mixtures become mtlab lists; lhotse's own reading of the same files is the
oracle for what mtlab's streamed split reads."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import write_wav

from mtlab.data import NUM_BINS, DataError, FeatureStats, data_samples_dir, from_lhotse, load_split
from mtlab.data.fromlhotse import main

lhotse = pytest.importorskip("lhotse")  # in the dev extra: CI installs it


def _pairs(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def sample_cuts(split: str, count: int | None = None) -> lhotse.CutSet:
    """The sample corpus's mixtures of ``split`` as lhotse users describe them: mixture recording, sources as
    custom Recording fields, one supervision per speaker (labelled ``spk<id>``)."""
    folder = data_samples_dir() / split
    sources = [dict(_pairs(folder / f"s{k}.scp")) for k in (1, 2)]
    speakers = {row[0]: row[1:] for row in _pairs(folder / "spk.txt")}
    cuts = []
    for name, path in _pairs(folder / "mix_clean.scp")[:count]:
        rec = lhotse.Recording.from_file(folder / path if not Path(path).is_absolute() else path, recording_id=name)
        cut = rec.to_cut()
        for k, src in enumerate(sources, start=1):
            file = src[name] if Path(src[name]).is_absolute() else folder / src[name]
            setattr(cut, f"source_{k}", lhotse.Recording.from_file(file, recording_id=f"{name}-s{k}"))
        cut.supervisions = [lhotse.SupervisionSegment(f"{name}-{k}", name, 0.0, rec.duration,
                                                      speaker=f"spk{s}")
                            for k, s in enumerate(speakers[name])]
        cuts.append(cut)
    return lhotse.CutSet.from_cuts(cuts)


def stats() -> FeatureStats:
    return FeatureStats(torch.zeros(NUM_BINS), torch.ones(NUM_BINS), 1, "test")


def test_streamed_split_reads_what_lhotse_reads(tmp_path: Path) -> None:
    train, dev = sample_cuts("train", 12), sample_cuts("dev", 5)
    prepared = from_lhotse({"train": train, "dev": dev}, tmp_path / "lists")
    assert prepared.counts == {"train": 12, "dev": 5}
    labels = {int(i): s for i, s in _pairs(tmp_path / "lists" / "speakers.tsv")[1:]}
    for split, cuts in (("train", train), ("dev", dev)):
        data = load_split(root=tmp_path / "lists", split=split, linkedset="clean", stream=True, stats=stats(),
                          progress=False)
        assert data.names == list(cuts.ids)
        for i, cut in enumerate(cuts):
            item = data.audio(i)
            mix = torch.from_numpy(np.round(cut.load_audio()[0] * 32768).astype(np.int16))
            assert torch.equal(item["mix_wav"], mix)
            for k in (1, 2):
                src = torch.from_numpy(np.round(cut.load_custom(f"source_{k}")[0] * 32768).astype(np.int16))
                assert torch.equal(item["src_wav"][:, k - 1], src)
            ids = [int(x) for x in data.row(i).speakers.fields]
            assert [labels[x] for x in ids] == [s.speaker for s in cut.supervisions]
            assert int(item["spk"]) == ids[0]


@pytest.mark.slow
def test_a_recipe_trains_on_the_lists(tmp_path: Path, one_thread: None) -> None:
    import mtlab

    prepared = from_lhotse({"train": sample_cuts("train", 8), "dev": sample_cuts("dev", 4)}, tmp_path)
    data = {"root": str(tmp_path), "split": "train", "linkedset": "clean"}
    spec = {
        "name": "lhotse",
        "trainer": {"num_steps": 2, "batch_size": 4, "initial_learning_rate": 1e-3, "numbuckets": 1, "seed": 0,
                    "device": "cpu"},
        "models": {"enc": {"type": "BLSTM", "input_dim": 129, "hidden": 8}, "pool": {"type": "MeanPool"},
                   "head": {"type": "Linear", "in_features": 16, "out_features": len(prepared.speakers)}},
        "tasks": {"spk": {"inputs": ["features"], "targets": ["spk"], "outputs": ["logits"],
                          "nodes": [{"name": "h", "model": "enc", "inputs": ["features"]},
                                    {"name": "pooled", "model": "pool", "inputs": ["h"]},
                                    {"name": "logits", "model": "head", "inputs": ["pooled"]}],
                          "loss": {"type": "crossentropy", "output": "logits", "target": "spk"},
                          "linkedsets": {"clean": {"data": data, "valid": {"split": "dev"}}}}},
    }
    trainer = mtlab.from_recipe(spec).trainer
    before = trainer.models["head"].weight.detach().clone()
    for _ in range(2):
        trainer.step()
    assert [r["step"] for r in trainer.log.rows()] == [1, 2]
    assert torch.isfinite(torch.tensor(trainer.log.rows()[-1]["spk/clean/loss"]))
    assert not torch.equal(before, trainer.models["head"].weight)


def test_lazy_manifest_gives_the_same_lists(tmp_path: Path) -> None:
    cuts = sample_cuts("train", 6)
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    from_lhotse({"train": cuts}, tmp_path / "eager")
    assert main([str(tmp_path / "lazy"), f"train={tmp_path / 'cuts.jsonl.gz'}"]) == 0
    for name in ("mix_clean.scp", "s1.scp", "s2.scp", "spk.txt"):
        assert (tmp_path / "lazy" / "train" / name).read_text() == (tmp_path / "eager" / "train" / name).read_text()
    assert main([str(tmp_path / "x"), f"train={tmp_path / 'missing.jsonl.gz'}"]) == 2


def test_cuts_without_speakers_write_no_speaker_list(tmp_path: Path) -> None:
    cuts = sample_cuts("train", 3)
    for cut in cuts:
        cut.supervisions = []
    from_lhotse({"train": cuts}, tmp_path)
    assert not (tmp_path / "train" / "spk.txt").exists()
    data = load_split(root=tmp_path, split="train", linkedset="clean", targets=("src_mag",), stream=True,
                      stats=stats(), progress=False)
    assert len(data) == 3 and data.audio(0)["src_wav"].shape[1] == 2


@pytest.mark.parametrize("case, message", [
    ("mixed", "MixedCut"),
    ("partial", "mtlab reads whole files"),
    ("no source", "no custom field source_2"),
    ("16 kHz", "16000 Hz"),
    ("speakers", "one supervision per source"),
    ("short source", "sample for sample"),
])
def test_unreadable_cuts_name_the_cut_and_the_fix(tmp_path: Path, case: str, message: str) -> None:
    cut = next(iter(sample_cuts("train", 1)))
    if case == "mixed":
        cut = cut.mix(cut, offset_other_by=0.1)
    elif case == "partial":
        cut = cut.truncate(duration=cut.duration / 2)
    elif case == "no source":
        del cut.custom["source_2"]
    elif case == "16 kHz":
        wav = write_wav(tmp_path / "16k.wav", np.zeros(16000, dtype=np.int16), rate=16000)
        cut.source_1 = lhotse.Recording.from_file(wav)
    elif case == "speakers":
        cut.supervisions = cut.supervisions[:1]
    else:
        wav = write_wav(tmp_path / "short.wav", np.zeros(100, dtype=np.int16))
        cut.source_1 = lhotse.Recording.from_file(wav)
    with pytest.raises(DataError, match=message) as err:
        from_lhotse({"train": lhotse.CutSet.from_cuts([cut])}, tmp_path / "out")
    assert repr(cut.id) in str(err.value)


def test_bad_splits_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="train"):
        from_lhotse({"tr": sample_cuts("train", 1)}, tmp_path)
    with pytest.raises(DataError, match="no cuts"):
        from_lhotse({"train": lhotse.CutSet.from_cuts([])}, tmp_path)
