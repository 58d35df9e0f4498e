"""Corpus layouts: miniature wsj0-2mix / WHAM! / LibriMix trees made from data_samples/ are read back,
prepared into list files, loaded like data_samples/ and trained on by a recipe."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path

import pytest
import torch
from helpers.corpora import build, make_layouts, recipe

from mtlab.data import DataError, DataWarning, data_samples_dir, load_split, read_list, read_wav
from mtlab.data.layouts import LAYOUTS, get_layout, prepare, read_corpus

PER_SPLIT = 4


@pytest.fixture(params=list(LAYOUTS))
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    layout = request.param
    make_layouts.make_tree(layout, tmp_path / layout, PER_SPLIT)
    return layout, tmp_path / layout


def samples(split: str) -> list[tuple[str, int, int]]:
    """The first PER_SPLIT data_samples mixtures of a split (as the script takes them) and their speakers."""
    rows = [line.split() for line in (data_samples_dir() / split / "spk.txt").read_text().splitlines()]
    return [(n, int(a), int(b)) for n, a, b in sorted(rows)[:PER_SPLIT]]


def sample_wave(split: str, stream: str, name: str) -> torch.Tensor:
    return read_wav(read_list(data_samples_dir() / split / f"{stream}.scp")[name].resolve())


def test_reader_finds_every_split_mode_source_and_speaker(tree: tuple[str, Path]) -> None:
    layout, root = tree
    corpus = read_corpus(layout, root)
    assert set(corpus) == {"train", "dev", "test"}
    expected_sets = ["clean"] if layout == "wsj0-2mix" else ["clean", "both", "single"]
    offset = 100 if layout == "librimix" else 400
    for split, mixtures in corpus.items():
        assert len(mixtures) == PER_SPLIT
        by_speakers = {(int(m.speakers[0]) - offset, int(m.speakers[1]) - offset): m for m in mixtures}
        for name, a, b in samples(split):
            m = by_speakers[(a, b)]  # speaker ids parsed back from the corpus file names
            assert list(m.mixtures) == expected_sets
            torch.testing.assert_close(read_wav(m.mixtures["clean"]), sample_wave(split, "mix_clean", name))
            for k in (0, 1):
                torch.testing.assert_close(read_wav(m.sources[k]), sample_wave(split, f"s{k + 1}", name))
            if layout != "wsj0-2mix":
                noisy = sample_wave(split, "mix_noisy", name)
                torch.testing.assert_close(read_wav(m.mixtures["both"]), noisy)
                noise = read_wav(m.noise)
                torch.testing.assert_close(noise, noisy - sample_wave(split, "mix_clean", name))
                torch.testing.assert_close(read_wav(m.mixtures["single"]), sample_wave(split, "s1", name) + noise)


@pytest.mark.slow
def test_prepared_lists_load_as_the_sample_corpus(tree: tuple[str, Path], tmp_path: Path) -> None:
    layout, root = tree
    out = tmp_path / "lists"
    prepared = prepare(layout, root, out)
    assert prepared.counts == {"train": PER_SPLIT, "dev": PER_SPLIT, "test": PER_SPLIT}
    pairs = [("clean", "clean")] + ([] if layout == "wsj0-2mix" else [("both", "noisy")])
    assert prepared.linkedsets[: len(pairs)] == tuple(p[0] for p in pairs)
    targets = ("mix_mag", "src_mag", "binary_targets", "spk_pair")
    offset = 100 if layout == "librimix" else 400
    for ours, theirs in pairs:
        data = load_split(out, split="dev", linkedset=ours, targets=targets)
        reference = load_split(data_samples_dir(), split="dev", linkedset=theirs, targets=targets)
        assert len(data) == PER_SPLIT
        for i, _name in enumerate(data.names):
            a, b = (int(prepared.speakers[int(k)]) - offset for k in data[i]["spk_pair"])  # back to the sample ids
            j = reference.names.index(next(n for n, x, y in samples("dev") if (x, y) == (a, b)))
            for key in ("mix_mag", "src_mag", "binary_targets"):
                torch.testing.assert_close(data[i][key], reference[j][key])
    assert (out / "speakers.tsv").read_text().splitlines()[0] == "id\tspeaker"
    assert f'"layout": "{LAYOUTS[layout].name}"' in (out / "layout.json").read_text()


@pytest.mark.slow
def test_a_recipe_trains_from_each_layout(tree: tuple[str, Path], tmp_path: Path, one_thread: None) -> None:
    layout, root = tree
    prepared = prepare(layout, root, tmp_path / "lists")
    linkedsets = ["clean"] if layout == "wsj0-2mix" else ["clean", "both"]
    trainer = build(recipe(prepared.out, linkedsets, len(prepared.speakers)))
    params = {k: v.detach().clone() for k, v in trainer.models["enc"].named_parameters()}
    for _ in range(2):
        trainer.step()
    rows = trainer.log.rows()
    assert [r["step"] for r in rows] == [1, 2]
    for task in ("spk", "frames"):
        for ls in linkedsets:
            assert torch.isfinite(torch.tensor(rows[-1][f"{task}/{ls}/loss"]))
    moved = [k for k, v in trainer.models["enc"].named_parameters() if not torch.equal(v, params[k])]
    assert moved, "the shared encoder did not train"


def test_librimix_metadata_is_followed_and_relocated(tmp_path: Path) -> None:
    root = tmp_path / "orig"
    top = make_layouts.make_tree("librimix", root, 2)
    moved = tmp_path / "moved"
    shutil.move(str(root), str(moved))  # the CSVs keep the old absolute paths, as on a copied corpus
    prepared = prepare("librimix", moved / "Libri2Mix", tmp_path / "lists", modes=["both"])
    assert prepared.linkedsets == ("both",)
    paths = [e.resolve() for e in read_list(tmp_path / "lists" / "train" / "mix_both.scp").values()]
    assert all(p.is_file() and str(p).startswith(str(moved)) for p in paths)
    # The metadata decides which mixtures exist: a row without a file is an error naming the CSV line.
    csv_path = moved / top.relative_to(root) / "metadata" / "mixture_dev_mix_both.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(lines + [lines[-1].replace("de01", "de99")]) + "\n")
    with pytest.raises(DataError, match=r"mixture_dev_mix_both.csv:4: .*not found"):
        prepare("librimix", moved, tmp_path / "lists2")


def test_bad_corpora_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown corpus layout 'wsj'; choose from wsj0-2mix, wham, librimix"):
        get_layout("wsj")
    with pytest.raises(DataError, match="only the librimix layout"):
        get_layout("wham", train="train-360")
    with pytest.raises(DataError, match="no wsj0-2mix split folder"):
        read_corpus("wsj0-2mix", tmp_path)
    top = make_layouts.make_tree("wham", tmp_path / "wham", 2)
    with pytest.raises(DataError, match=r"\['reverb'\] are not in wham; it has clean, both, single"):
        read_corpus("wham", tmp_path / "wham", modes=["clean", "reverb"])
    shutil.rmtree(top / "tr" / "mix_single")
    with pytest.raises(DataError, match=r"no mixtures for linked set\(s\) \['single'\]"):
        read_corpus("wham", tmp_path / "wham", modes=["clean", "single"])
    (top / "cv" / "s3").mkdir()
    with pytest.raises(DataError, match="three speakers"):
        read_corpus("wham", tmp_path / "wham")
    shutil.rmtree(top / "cv" / "s3")
    victim = next((top / "tt" / "s2").glob("*.wav"))
    victim.unlink()
    with pytest.raises(DataError, match=f"no {victim.stem}.wav"):
        read_corpus("wham", top)
    # 16 kHz audio is refused with the fix.
    wsj = make_layouts.make_tree("wsj0-2mix", tmp_path / "w16", 1)
    for path in wsj.rglob("*.wav"):
        with wave.open(str(path), "rb") as r:
            frames = r.readframes(r.getnframes())
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
            w.writeframes(frames)
    with pytest.raises(DataError, match="use the corpus's wav8k version"):
        prepare("wsj0-2mix", wsj, tmp_path / "lists16")


def test_command_line_prepares_and_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mtlab.data.layouts import main

    make_layouts.make_tree("librimix", tmp_path / "corpus", 2)
    assert main(["librimix", str(tmp_path / "corpus"), str(tmp_path / "lists"), "--linkedsets", "clean"]) == 0
    assert "librimix -> " in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "lists" / "dev").iterdir()) == [
        "mix_clean.scp", "noise.scp", "s1.scp", "s2.scp", "spk.txt"]
    assert main(["librimix", str(tmp_path / "corpus"), str(tmp_path / "x"), "--train", "train-360"]) == 2
    assert "no train-360/ folder for train='train-360'; found dev, test" in capsys.readouterr().out


def test_a_missing_split_is_said(tmp_path: Path) -> None:
    top = make_layouts.make_tree("wsj0-2mix", tmp_path / "corpus", 2)
    shutil.rmtree(top / "tt")
    with pytest.warns(DataWarning, match="no tt folder; listing the other splits only"):
        prepared = prepare("wsj0-2mix", tmp_path / "corpus", tmp_path / "lists")
    assert prepared.counts == {"train": 2, "dev": 2}


def test_mtlab_prepare_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mtlab.apps.cli import main

    make_layouts.make_tree("wham", tmp_path / "corpus", 2)
    out = tmp_path / "lists"
    assert main(["prepare", "wham", str(tmp_path / "corpus"), "--out", str(out), "--linkedsets", "both"]) == 0
    said = capsys.readouterr().out
    assert f"wham -> {out}: train 2, dev 2, test 2 mixtures; linked sets both" in said
    assert f'root = "{out}"' in said
    assert len(read_list(out / "test" / "mix_both.scp")) == 2 and not (out / "test" / "mix_clean.scp").exists()
    assert main(["prepare", "timit", str(tmp_path / "corpus")]) == 2
    assert "unknown corpus layout 'timit'" in capsys.readouterr().err
