"""Shards: written deterministically and exactly (tarfile and the WAVs are the oracle), read like the streamed
path, split between ranks by shard, from a folder or an fsspec URL; missing and damaged shards are named."""
from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mtlab.apps.cli import main
from mtlab.base.errors import ConfigError
from mtlab.data import DataError, data_samples_dir, load_split
from mtlab.data.audio import read_wav_int16
from mtlab.data.features import ORIGINAL
from mtlab.data.shards import ShardedSplit, verify_shards
from mtlab.data.shardwriter import write_shards
from mtlab.tasks.sampling import BatchStream
from mtlab.tasks.sources import SegmentedExamples, trainset_fraction

pytestmark = pytest.mark.usefixtures("one_thread")
TARGETS = ("mix_mag", "src_mag", "binary_targets", "usedbins", "frame_target", "spk", "spk_pair")


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dev/clean of data_samples/ (24 utterances) as 5 shards of at most 5."""
    out = tmp_path_factory.mktemp("shards")
    write_shards(None, "dev", "clean", out, shard_size=5, progress=False)
    return out


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_shards_hold_the_wavs_exactly_and_are_written_deterministically(shard_root: Path, tmp_path: Path) -> None:
    folder = shard_root / "dev" / "clean"
    lists = load_split(None, "dev", "clean", stream=True, progress=False)
    sharded = load_split(shard_root, "dev", "clean", stream=True)
    assert isinstance(sharded, ShardedSplit) and len(sharded.files) == 5
    seen = 0
    for k, path in enumerate(sharded.files):  # the standard tar reader, not the index, finds every member
        with tarfile.open(path) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for key in sorted({n.split(".")[0] for n in members}):
                i = int(key)
                row = lists.row(i)
                assert int(sharded.shard_of[i]) == k
                for part, entry in [("mix", row.mix), *((f"s{j + 1}", s) for j, s in enumerate(row.sources))]:
                    member = members[f"{key}.{part}.wav"]
                    raw = tar.extractfile(member).read()
                    stored = torch.from_numpy(np.frombuffer(raw[44:], dtype="<i2").copy())
                    assert torch.equal(stored, read_wav_int16(entry.resolve())), (key, part)
                    m = ["mix", "s1", "s2"].index(part)
                    assert sharded._offset[i, m] == member.offset_data and sharded._size[i, m] == member.size
                info = json.loads(tar.extractfile(members[f"{key}.json"]).read())
                assert info == {"name": row.name, "samples": int(lists.samples[i]), "ivec": None,
                                "speakers": list(row.speakers.ints(2))}
                seen += 1
    assert seen == len(lists) and sharded.names == lists.names
    later = time.time() + 86400  # a day later: nothing of the time of writing may reach the files
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: later)
        again = write_shards(None, "dev", "clean", tmp_path, shard_size=5, progress=False)
    assert digests(again) == digests(folder)  # same corpus, same bytes (no time stamps, owners)
    assert verify_shards(shard_root, "dev", "clean") == sharded.files


def test_sharded_batches_equal_the_streamed_lists_exactly(shard_root: Path) -> None:
    lists = load_split(None, "dev", "clean", targets=TARGETS, stream=True, progress=False)
    sharded = load_split(shard_root, "dev", "clean", targets=TARGETS, stream=True)
    assert sharded.lengths == lists.lengths and torch.equal(sharded.stats.mean, lists.stats.mean)
    for view, draws in ((lambda s: s, None), (lambda s: SegmentedExamples(trainset_fraction(s, 0.5), 60), 3)):
        a, b = BatchStream(view(lists), 4, 3, seed=2), BatchStream(view(sharded), 4, 3, seed=2)
        assert len(a) == len(b)
        for _ in range(draws or len(a)):  # the same batches (a whole epoch unsegmented), every key bit for bit
            (da, la), (db, lb) = next(a), next(b)
            assert sorted(da) == sorted(db)
            for key in da:
                assert torch.equal(da[key], db[key]) and torch.equal(la[key], lb[key]), key
    one = sharded[3]
    for key, value in lists[3].items():  # torch.allclose: torch.testing's first call costs seconds of imports
        assert one[key].shape == value.shape and (torch.allclose(one[key], value, rtol=1e-5, atol=1e-5)
                                                  if value.is_floating_point() else torch.equal(one[key], value)), key


def test_each_rank_draws_from_its_own_shards_only_and_the_ranks_cover_the_split(shard_root: Path) -> None:
    full = load_split(shard_root, "dev", "clean", stream=True)
    epoch: dict[int, list[list[int]]] = {}
    for rank in (0, 1):
        split = load_split(shard_root, "dev", "clean", stream=True)
        stream = BatchStream(split, 3, 2, seed=7, shard=(rank, 2))
        epoch[rank] = stream.epoch_batches()
        for _ in range(len(stream)):
            next(stream)
        own = {f for k, f in enumerate(split.files) if k % 2 == rank}
        assert split.opened == own  # every shard of its own read over an epoch, none of the other rank's
    assert len(epoch[0]) == len(epoch[1])  # ranks stay in step: the smaller part cycles
    drawn = [i for r in (0, 1) for b in epoch[r] for i in b]
    assert set(drawn) == set(range(len(full)))
    for r in (0, 1):
        assert {int(full.shard_of[i]) % 2 for b in epoch[r] for i in b} == {r}
    one = BatchStream(full, 3, 2, seed=7)  # one process: every utterance once, as an unsharded stream
    plain = BatchStream(load_split(None, "dev", "clean", stream=True, progress=False), 3, 2, seed=7)
    assert one.epoch_batches() == plain.epoch_batches()


def test_fewer_shards_than_ranks_is_refused_naming_the_fix(shard_root: Path, tmp_path: Path) -> None:
    split = load_split(shard_root, "dev", "clean", stream=True)
    with pytest.raises(ConfigError, match=r"rank\(s\) \[5\] of 6 get no example: .* 5 shard\(s\).*--shard-size N"):
        BatchStream(split, 3, shard=(0, 6))
    with pytest.raises(ConfigError, match=r"rank\(s\) \[1\] of 2 get no example: .* 1 shard\(s\)"):
        BatchStream(trainset_fraction(split, 0.2), 3, shard=(0, 2))  # the head of the list lies in shard 0


def copy_of(shard_root: Path, tmp_path: Path) -> Path:
    shutil.copytree(shard_root, tmp_path / "copy")
    return tmp_path / "copy"


def test_a_missing_or_cut_shard_is_named(shard_root: Path, tmp_path: Path) -> None:
    root = copy_of(shard_root, tmp_path)
    split = load_split(root, "dev", "clean", stream=True)
    (root / "dev" / "clean" / "shard-000002.tar").unlink()
    with pytest.raises(DataError, match=r"shard-000002.tar: shard 2 of 5 is missing.*mtlab shard"):
        split.audio(10)
    with pytest.raises(DataError, match="shard 2 of 5 is missing"):
        verify_shards(root, "dev", "clean")
    path = root / "dev" / "clean" / "shard-000003.tar"
    path.write_bytes(path.read_bytes()[:-1024])
    with pytest.raises(DataError, match=r"shard-000003.tar: \d+ bytes but the index says \d+"):
        split.audio(15)
    with pytest.raises(DataError, match=r"noisy/index.npz: no shard index \(written here: \['clean'\]\)"):
        load_split(root, "dev", "noisy", stream=True)


def test_a_damaged_member_fails_its_checksum_or_is_skipped_and_recorded(shard_root: Path, tmp_path: Path) -> None:
    root = copy_of(shard_root, tmp_path)
    split = load_split(root, "dev", "clean", stream=True)
    path = root / "dev" / "clean" / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    data[int(split._offset[6, 1]) + 500] ^= 0xFF  # one byte of utterance 6's first source
    path.write_bytes(bytes(data))
    assert isinstance(split.audio(5), dict)  # the other members of the shard read fine
    with pytest.raises(DataError, match=rf"shard-000001.tar: member 00000006 \({split.name(6)!r}, part 1\) fails its "
                                        "CRC-32 check"):
        split.audio(6)
    with pytest.raises(DataError, match="SHA-256 or size differs"):
        verify_shards(root, "dev", "clean")
    skipping = load_split(root, "dev", "clean", stream=True, on_bad_data="skip")
    stream = BatchStream(skipping, 24, seed=0)
    data_, _ = next(stream)
    assert data_["features"].shape[0] == 23 and [s["name"] for s in stream.skipped] == [split.name(6)]


def test_shards_read_from_fsspec_urls_equal_the_folder(shard_root: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    local = load_split(shard_root, "dev", "clean", stream=True)
    memory = fsspec.filesystem("memory")
    memory.put(str(shard_root / "dev"), "/corpus21/dev", recursive=True)
    for url in ("memory://corpus21", shard_root.as_uri()):
        remote = load_split(url, "dev", "clean", stream=True)
        assert remote.files[0].startswith(url) and remote.names == local.names
        a, b = BatchStream(local, 6, 2, seed=1), BatchStream(remote, 6, 2, seed=1)
        for _ in range(2):
            (da, _), (db, _) = next(a), next(b)
            assert all(torch.equal(da[k], db[k]) for k in da)
    memory.rm("/corpus21", recursive=True)


def test_loading_checks_what_the_shards_hold(shard_root: Path) -> None:
    with pytest.raises(DataError, match="computed with spectral .* pass stats=... or write the shards"):
        load_split(shard_root, "dev", "clean", stream=True, spectral=ORIGINAL)
    stats = load_split(shard_root, "dev", "clean", stream=True).stats
    assert load_split(shard_root, "dev", "clean", stream=True, spectral=ORIGINAL, stats=stats).stats is stats
    with pytest.raises(DataError, match="num_sources = 2, asked for 3"):
        load_split(shard_root, "dev", "clean", stream=True, num_sources=3)
    with pytest.raises(DataError, match="read with stream=True and without dynamic_mix"):
        load_split(shard_root, "dev", "clean")
    with pytest.raises(DataError, match="shard_size=0"):
        write_shards(None, "dev", "clean", shard_root, shard_size=0)
    with pytest.raises(DataError, match="that is the corpus itself"):
        write_shards(None, "dev", "clean", data_samples_dir())
    with pytest.raises(DataError, match="already shards"):
        write_shards(shard_root, "dev", "clean", shard_root / "again")


def test_the_shard_command_writes_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shard", str(data_samples_dir()), str(tmp_path), "--splits", "dev", "--linkedsets", "noisy",
                 "--shard-size", "10"]) == 0
    assert "dev/noisy: 3 shard(s)" in capsys.readouterr().out
    assert len(load_split(tmp_path, "dev", "noisy", stream=True)) == 24
    assert main(["shard", "-", str(tmp_path), "--verify"]) == 0
    assert "dev/noisy: 3 shards match the index" in capsys.readouterr().out
    (tmp_path / "dev" / "noisy" / "shard-000001.tar").write_bytes(b"")
    assert main(["shard", "-", str(tmp_path), "--verify"]) == 2
    assert "shard-000001.tar: its SHA-256 or size differs" in capsys.readouterr().err


def shard_recipe(tmp_path: Path, num_steps: int, workers: bool = False) -> Path:
    """The tiny recipe of the recipe tests over shards of its corpus (train: 4 shards per linked set)."""
    from helpers.recipes import make_tiny_corpus, write_tiny_recipe

    corpus = make_tiny_corpus(tmp_path / "corpus")
    assert main(["shard", str(corpus), str(tmp_path / "shards"), "--shard-size", "2"]) == 0
    path = write_tiny_recipe(tmp_path / "tiny.toml", tmp_path / "shards", num_steps=num_steps, valid_frequency=2)
    if workers:
        text = path.read_text().replace('split = "train", linkedset = "clean" }',
                                        'split = "train", linkedset = "clean", num_workers = 2 }')
        assert "num_workers" in text
        path.write_text(text)
    return path


@pytest.mark.slow  # starts DataLoader worker processes
def test_a_recipe_over_shards_resumes_exactly_through_a_worker_restart(tmp_path: Path) -> None:
    from mtlab.apps.recipe import from_recipe, load
    from mtlab.training.loop import run

    path = shard_recipe(tmp_path, num_steps=8, workers=True)
    full = from_recipe(path)
    examples = full.trainer.tasks["spk"].linkedsets["clean"].examples
    assert isinstance(examples, ShardedSplit) and len(examples.files) == 4
    assert isinstance(full.trainer.tasks["spk"].linkedsets["clean"].valid, ShardedSplit)
    run(full, progress=False)
    half = from_recipe(path)
    run(half, steps=3, progress=False, expdir=tmp_path / "exp")
    resumed = load(tmp_path / "exp" / "final.pt")  # new process state, new workers, mid-epoch
    run(resumed, progress=False)
    assert resumed.trainer.step_count == full.trainer.step_count == 8
    assert all(torch.equal(p, full.trainer.params[k]) for k, p in resumed.trainer.params.items())
    assert resumed.trainer.history.equals(full.trainer.history)


@pytest.mark.slow  # spawns two training processes
def test_a_recipe_over_shards_trains_on_two_ranks(tmp_path: Path) -> None:
    import mtlab.apps.launch

    path = shard_recipe(tmp_path, num_steps=4)
    res = mtlab.apps.launch.launch(str(path), nprocs=2, steps=2, out_dir=str(tmp_path / "out"))
    h0, h1 = res["history"][0], res["history"][1]
    assert len(h0) == 2 and h0["frames/loss"].tolist() == pytest.approx(h1["frames/loss"].tolist())
    state = torch.load(res["checkpoint"], weights_only=True)
    assert state["step"] == 2 and state["streams"]["frames/noisy"]["world_size"] == 2


def test_i_vectors_are_written_and_read_as_the_list_path_gives_them(tmp_path: Path) -> None:
    from mtlab.data.vectors import VectorList

    names = load_split(None, "dev", "clean", stream=True, progress=False).names
    gen = np.random.default_rng(0)
    lines = []
    for name in names:
        (tmp_path / f"{name}.txt").write_text(",".join(" ".join(str(x) for x in row)
                                                       for row in gen.normal(size=(2, 3)).round(4)) + "\n")
        lines.append(f"{name} {name}.txt\n")
    (tmp_path / "ivecs.txt").write_text("".join(lines))
    ivec = VectorList(str(tmp_path / "ivecs.txt"), nrcol=3, nrs=2, mvn="global")
    targets = ("frame_target", "ivec")
    lists = load_split(None, "dev", "clean", targets=targets, ivec=ivec, stream=True, progress=False)
    write_shards(None, "dev", "clean", tmp_path / "out", shard_size=10, ivec=ivec, progress=False)
    sharded = load_split(tmp_path / "out", "dev", "clean", targets=targets, stream=True)
    assert load_split(tmp_path / "out", "dev", "clean", targets=targets, stream=True, ivec=ivec).lengths
    with pytest.raises(DataError, match=r"written with \{'nrcol': 3, 'nrs': 2, 'mvn': 'global'\}"):
        load_split(tmp_path / "out", "dev", "clean", targets=targets, stream=True,
                   ivec=VectorList(ivec.list, nrcol=3, nrs=2))
    a, b = BatchStream(lists, 8, 2, seed=4), BatchStream(sharded, 8, 2, seed=4)
    for _ in range(len(a)):
        (da, _), (db, _) = next(a), next(b)
        assert sorted(da) == sorted(db) and da["ivec"].shape == (len(da["ivec"]), 6)
        assert all(torch.equal(da[k], db[k]) for k in da)
    write_shards(None, "dev", "clean", tmp_path / "plain", shard_size=10, progress=False)
    with pytest.raises(DataError, match=r"hold no data for targets \['ivec'\]"):
        load_split(tmp_path / "plain", "dev", "clean", targets=targets, stream=True)


@pytest.mark.slow  # builds and steps a recipe's trainer (seconds): the slow tier, as the other recipe-level tests
def test_a_recipe_reads_shards_at_a_url(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    from mtlab.apps.recipe import from_recipe

    path = shard_recipe(tmp_path, num_steps=1)
    memory = fsspec.filesystem("memory")
    memory.put(str(tmp_path / "shards"), "/recipe21", recursive=True)
    path.write_text(path.read_text().replace(str(tmp_path / "shards"), "memory://recipe21"))
    try:
        exp = from_recipe(path)
        examples = exp.trainer.tasks["frames"].linkedsets["noisy"].examples
        assert isinstance(examples, ShardedSplit) and examples.files[0].startswith("memory://recipe21/train/noisy/")
        exp.trainer.step()
        assert examples.opened and all(f.startswith("memory://") for f in examples.opened)
    finally:
        memory.rm("/recipe21", recursive=True)
