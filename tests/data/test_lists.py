"""List parsing and joining by utterance name."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtlab.data import DataError, DataWarning, join_lists, read_list


def test_read_list_resolves_relative_to_list_dir(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.scp"
    path.parent.mkdir()
    path.write_text("u1 wav/u1.wav\n\nu2 /abs/u2.wav\nu3 7 8\n")
    entries = read_list(path)
    assert list(entries) == ["u1", "u2", "u3"]
    assert entries["u1"].resolve() == tmp_path / "sub" / "wav" / "u1.wav"
    assert entries["u2"].resolve() == Path("/abs/u2.wav")
    assert entries["u3"].ints(2) == (7, 8) and entries["u3"].line == 4


def test_unparsable_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.scp"
    path.write_text("u1 a.wav\nlonely\n")
    with pytest.raises(DataError, match=r"bad\.scp:2: expected 'name value'"):
        read_list(path)


def test_repeated_name_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.scp"
    path.write_text("u1 a.wav\nu2 b.wav\nu1 c.wav\n")
    with pytest.raises(DataError, match=r"dup\.scp:3: name 'u1' repeats line 1"):
        read_list(path)


def test_non_integer_field_names_line(tmp_path: Path) -> None:
    path = tmp_path / "spk.txt"
    path.write_text("u1 1 2\nu2 x 2\n")
    with pytest.raises(DataError, match=r"spk\.txt:2: expected integers"):
        read_list(path)["u2"].ints(2)


def test_missing_list_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nothere\.scp: list file not found"):
        read_list(tmp_path / "nothere.scp")


def test_join_drops_and_counts_missing(tmp_path: Path) -> None:
    (tmp_path / "a.scp").write_text("u1 x\nu2 x\nu3 x\nu4 x\n")
    (tmp_path / "b.scp").write_text("u4 y\nu2 y\nu1 y\nu5 y\n")
    lists = {"a.scp": read_list(tmp_path / "a.scp"), "b.scp": read_list(tmp_path / "b.scp")}
    with pytest.warns(DataWarning, match="kept 3 utterances, dropped 2"):
        names, report = join_lists(lists)
    assert names == ["u1", "u2", "u4"]
    assert report.num_dropped == 2 and set(report.dropped) == {"u3", "u5"}
    assert report.missing == {"a.scp": ("u5",), "b.scp": ("u3",)}
    assert "1 missing from a.scp" in str(report) and "1 missing from b.scp" in str(report)


def test_join_with_nothing_in_common_raises(tmp_path: Path) -> None:
    (tmp_path / "a.scp").write_text("u1 x\n")
    (tmp_path / "b.scp").write_text("v1 y\n")
    lists = {"a.scp": read_list(tmp_path / "a.scp"), "b.scp": read_list(tmp_path / "b.scp")}
    with pytest.raises(DataError, match=r"no utterance name is in all of: a\.scp \(1 names\), b\.scp"):
        join_lists(lists)


def test_a_list_that_is_not_utf8_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "wav.scp"
    path.write_bytes(b"utt1 a.wav\n" + "utt2 caf\u00e9.wav\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"wav.scp:2: not UTF-8 text .*save the list as UTF-8"):
        read_list(path)
