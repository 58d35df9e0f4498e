"""Corpus trees read in place (``load_split(layout=...)``, a recipe's ``data.layout``): the same manifest and
examples as ``prepare()`` + list files, nothing written beside the corpus, caches in the user cache folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import build, make_layouts, recipe

from mtlab.data import DataError, load_split
from mtlab.data.corpus import cached_stats
from mtlab.data.layouts import LAYOUTS, prepare

pytestmark = pytest.mark.usefixtures("one_thread")
PER_SPLIT = 3


@pytest.fixture(params=list(LAYOUTS))
def tree(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    make_layouts.make_tree(request.param, tmp_path / "corpus", PER_SPLIT)
    return request.param, tmp_path / "corpus"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def same_split(ours: object, theirs: object) -> None:
    """Equal manifests (names, files, speaker ids, header lengths) and equal examples and batch items."""
    assert ours.names == theirs.names and len(ours) > 0
    assert np.array_equal(ours.samples, theirs.samples) and ours.lengths == theirs.lengths
    assert ours.num_speakers == theirs.num_speakers
    for i in range(len(ours)):
        a, b = ours.row(i), theirs.row(i)
        assert os.path.realpath(a.mix.resolve()) == os.path.realpath(b.mix.resolve())
        assert [os.path.realpath(s.resolve()) for s in a.sources] == [os.path.realpath(s.resolve()) for s in b.sources]
        assert a.speakers.ints(2) == b.speakers.ints(2)
        x, y = ours[i], theirs[i]
        assert sorted(x) == sorted(y)
        for key in x:
            torch.testing.assert_close(x[key], y[key], rtol=0, atol=0)
        u, v = ours.audio(i), theirs.audio(i)
        assert sorted(u) == sorted(v) and all(torch.equal(u[k], v[k]) for k in u)


def test_a_tree_read_in_place_equals_its_prepared_lists_and_writes_nothing_beside_it(
        tree: tuple[str, Path], tmp_path: Path) -> None:
    layout, root = tree
    before = snapshot(root)
    prepared = prepare(layout, root, tmp_path / "lists")
    assert snapshot(root) == before
    linkedsets = ["clean"] if layout == "wsj0-2mix" else ["clean", "both", "single"]
    for linkedset in linkedsets:
        train = load_split(root, layout=layout, split="train", linkedset=linkedset, stream=True, progress=False)
        reference = load_split(prepared.out, split="train", linkedset=linkedset, stream=True, progress=False)
        torch.testing.assert_close(train.stats.mean, reference.stats.mean, rtol=0, atol=0)
        same_split(train, reference)
        for split, folder in (("dev", "cv" if layout != "librimix" else "dev"), ("test", "test")):
            name = folder if split == "dev" else split  # mtlab's split name and the corpus's folder both work
            ours = load_split(root, layout=layout, split=name, linkedset=linkedset, stream=True, progress=False)
            same_split(ours, load_split(prepared.out, split=split, linkedset=linkedset, stream=True, progress=False))
            assert ours.stats is not None and torch.equal(ours.stats.mean, train.stats.mean)  # train's statistics
    assert snapshot(root) == before  # no list, statistics or length cache beside the corpus
    cache = tmp_path / "cache"
    assert list((cache / "stats").glob("*.json")) and list((cache / "samples").glob("*.npz"))


def test_a_second_load_reuses_the_user_cache(tree: tuple[str, Path], tmp_path: Path) -> None:
    layout, root = tree
    seen: list[tuple[int, int]] = []
    first = load_split(root, layout=layout, split="train", stream=True, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1] == (PER_SPLIT, PER_SPLIT)
    seen.clear()
    again = load_split(root, layout=layout, split="train", stream=True, progress=lambda d, t: seen.append((d, t)))
    assert seen == [] and torch.equal(again.stats.mean, first.stats.mean)
    # a file replaced in place (same name, other content) is another corpus: the statistics are computed again
    wav = Path(first.row(0).mix.resolve())
    data = bytearray(wav.read_bytes())
    data[2000:6000] = bytes(4000)
    wav.write_bytes(bytes(data))
    load_split(root, layout=layout, split="train", stream=True, progress=lambda d, t: seen.append((d, t)))
    assert seen


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Folders that refuse writes, for any user (root ignores a folder's permission bits): both cache writers
    (``Path.write_text`` for statistics, ``np.savez`` for lengths) raise PermissionError there."""
    folders: list[Path] = []
    refused: list[str] = []

    def guard(path: object) -> None:
        if any(str(path).startswith(str(f) + os.sep) for f in folders):
            refused.append(str(path))
            raise PermissionError(13, "Permission denied", str(path))

    write_text, savez = Path.write_text, np.savez
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: (guard(self), write_text(self, *a, **k))[1])
    monkeypatch.setattr(np, "savez", lambda file, *a, **k: (guard(file), savez(file, *a, **k))[1])
    yield folders
    assert refused, "nothing tried to write into the read-only folder"


def test_a_read_only_list_folder_caches_lengths_and_statistics_in_the_user_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: list[Path]) -> None:
    make_layouts.make_tree("wham", tmp_path / "corpus", PER_SPLIT)
    lists = prepare("wham", tmp_path / "corpus", tmp_path / "lists").out
    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    read_only.append(lists)
    before = snapshot(lists)
    lists.chmod(0o555), (lists / "train").chmod(0o555)
    try:
        seen: list[tuple[int, int]] = []
        first = load_split(lists, split="train", linkedset="both", stream=True, progress=lambda d, t: seen.append(d))
        assert seen and snapshot(lists) == before
        assert len(list((tmp_path / "cache" / "stats").glob("*.json"))) == 1
        assert len(list((tmp_path / "cache" / "samples").glob("*.npz"))) == 1
        seen.clear()
        again = load_split(lists, split="train", linkedset="both", stream=True, progress=lambda d, t: seen.append(d))
        assert seen == [] and torch.equal(again.stats.mean, first.stats.mean)
        assert np.array_equal(again.samples, first.samples)
        assert torch.equal(cached_stats(lists, "both", progress=False).mean, first.stats.mean)
    finally:
        lists.chmod(0o755), (lists / "train").chmod(0o755)


@pytest.mark.slow  # builds and trains a recipe: kept out of the fast tier
def test_a_recipe_trains_on_a_tree_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    make_layouts.make_tree("wham", tmp_path / "corpus", PER_SPLIT)
    root = tmp_path / "corpus"
    before = snapshot(root)
    spec = recipe(root, ["clean", "both"], 2 * PER_SPLIT * 3)
    for task in spec["tasks"].values():
        for data in (s["data"] for s in task["linkedsets"].values()):
            data["layout"] = "wham"
    trainer = build(spec)
    params = {k: v.detach().clone() for k, v in trainer.models["enc"].named_parameters()}
    for _ in range(2):
        trainer.step()
    assert any(not torch.equal(v, params[k]) for k, v in trainer.models["enc"].named_parameters())
    assert [r["step"] for r in trainer.log.rows()] == [1, 2]
    assert snapshot(root) == before


def test_bad_in_place_requests_name_the_fix(tree: tuple[str, Path]) -> None:
    layout, root = tree
    with pytest.raises(DataError, match="unknown corpus layout; choose from wsj0-2mix, wham, librimix"):
        load_split(root, layout="wsj", stream=True)
    with pytest.raises(DataError, match="split='valid': .* has the splits train, dev, test"):
        load_split(root, layout=layout, split="valid", stream=True)
    with pytest.raises(DataError, match="linkedset='noisy': .* has the linked sets clean"):
        load_split(root, layout=layout, linkedset="noisy", stream=True)
    with pytest.raises(DataError, match="needs stream=True"):
        load_split(root, layout=layout)
    with pytest.raises(DataError, match="no .* split folder"):
        load_split(root.parent, layout=layout, stream=True)


def test_a_recipe_names_a_bad_layout(tmp_path: Path) -> None:
    from mtlab.apps.settings import ConfigError

    spec = recipe(tmp_path, ["clean"], 4)
    data = spec["tasks"]["spk"]["linkedsets"]["clean"]["data"]
    data["layout"] = "wsj0mix2"
    with pytest.raises(ConfigError, match="unknown layout 'wsj0mix2' .*valid: wsj0-2mix, wham, librimix"):
        build(spec)
    data.update(layout="wham", stream=False)
    with pytest.raises(ConfigError, match="reads the corpus tree at root"):
        build(spec)


def test_manifests_are_cached_by_content_and_a_changed_tree_or_list_is_read_again(
        tree: tuple[str, Path], tmp_path: Path) -> None:
    from mtlab.data import inplace

    layout, root = tree
    first = load_split(root, layout=layout, split="train", stream=True, progress=False)
    trees = list((tmp_path / "cache" / "trees").glob("*.npz"))
    assert len(trees) == 1
    inplace._read_tree.cache_clear()  # as a new process: the manifest comes from the user cache folder
    again = load_split(root, layout=layout, split="train", stream=True, progress=False)
    same_split(again, first)
    # a mixture removed from the tree (and from the metadata, for LibriMix) is gone from the next manifest
    inplace._read_tree.cache_clear()
    row = first.row(len(first) - 1)
    name = row.name
    for path in root.rglob(f"{name}.wav"):
        path.unlink()
    for csv in root.rglob("mixture_*.csv"):
        csv.write_text("".join(line + "\n" for line in csv.read_text().splitlines() if name not in line))
    fewer = load_split(root, layout=layout, split="train", stream=True, progress=False)
    assert fewer.names == first.names[:-1] and len(fewer) == PER_SPLIT - 1
    # the lists of prepare(): a second load reads the cached columns; editing a list is seen
    lists = prepare(layout, root, tmp_path / "lists").out
    listed = load_split(lists, split="train", stream=True, progress=False)
    assert len(list((tmp_path / "cache" / "manifests").glob("*.npz"))) == 1
    same_split(load_split(lists, split="train", stream=True, progress=False), listed)
    spk = lists / "train" / "spk.txt"
    lines = spk.read_text().splitlines()
    swapped = [f"{n} {b} {a}" for n, a, b in (line.split() for line in lines)]
    spk.write_text("".join(line + "\n" for line in swapped))
    changed = load_split(lists, split="train", stream=True, progress=False)
    assert [changed.row(i).speakers.ints(2) for i in range(len(changed))] == \
        [listed.row(i).speakers.ints(2)[::-1] for i in range(len(listed))]


def test_dynamic_mixing_draws_from_a_tree_in_place(tree: tuple[str, Path]) -> None:
    from mtlab.data.dynamic import DynamicMix

    layout, root = tree
    mixed = load_split(root, layout=layout, split="train", stream=True, progress=False,
                       dynamic_mix={"gain_db": [-5, 5], "seed": 1})
    assert isinstance(mixed, DynamicMix) and len(mixed) == PER_SPLIT
    item = mixed.audio(0)
    # the mixture is the sum of its two int16 sources, sample for sample, as for list files
    assert torch.equal(item["mix_wav"].long(), item["src_wav"].long().sum(dim=-1))
