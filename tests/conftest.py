import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: derandomized in CI, so a failure CI finds reproduces with the same command, with a bounded
# number of examples (tests scale their budget from ``settings.default.max_examples``) and shrink time.
# ``HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties.py`` searches at random, 40x longer.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=25, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", derandomize=False, deadline=None, max_examples=1000, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
if PROFILE == "ci":
    # Hypothesis has no setting for the shrink phase's length (its engine allows 300 s); a derandomized
    # failure reproduces exactly, so CI shrinks for at most 30 s and the long profile shrinks fully.
    from hypothesis.internal.conjecture import engine as _engine

    if hasattr(_engine, "MAX_SHRINKING_SECONDS"):
        _engine.MAX_SHRINKING_SECONDS = 30


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts a subprocess, kernel, browser, wheel build or survey "
                            "(the fast tier is `pytest -m 'not slow'`)")


@pytest.fixture
def one_thread():
    """Tiny models: one torch thread is fastest and avoids oversubscribing shared CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
