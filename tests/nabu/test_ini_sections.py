"""One check for the evaluation configs' sections: their type, the keys mtlab honours, the keys the original reads."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtlab.base.errors import ConfigError
from mtlab.nabu.ini import section_kind

KEYS = ("score_type", "org_src", "base")


def check(conf: dict[str, str]) -> str:
    return section_kind(Path("scorer.cfg"), "[task0]", conf, "score_type", ("sdr", "sdr_snr"), "scores with", KEYS,
                        "scorer", ("org_src",))


def test_the_kind_once_every_key_is_honoured_and_the_required_are_there() -> None:
    assert check({"score_type": "sdr_snr", "org_src": "x"}) == "sdr_snr"
    with pytest.raises(ConfigError, match=r"scorer.cfg: \[task0\] score_type = 'pesq': mtlab scores with sdr, sdr_snr"):
        check({"score_type": "pesq", "org_src": "x"})
    with pytest.raises(ConfigError, match=r"\[task0\] colour: not a scorer setting mtlab honours \(it honours "
                                          r"score_type, org_src, base\)"):
        check({"score_type": "sdr", "org_src": "x", "colour": "red"})
    with pytest.raises(ConfigError, match=r"\[task0\] needs org_src \(the original reads it\)"):
        check({"score_type": "sdr", "base": "y"})
