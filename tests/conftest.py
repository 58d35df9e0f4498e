import os
import signal
import sys
from pathlib import Path

# The helpers package (tests/helpers/) is imported by one name wherever a test file sits: ``from helpers
# import make_models``, ``from helpers.nabu import write_recipe``. Test files never import each other.
sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402

os.environ.setdefault("LOKY_MAX_CPU_COUNT", "1")  # scikit-learn's k-means would count cores in a subprocess
if "MTLAB_CACHE" not in os.environ:  # parsed lists, header lengths, statistics: not in the user's own cache
    import tempfile

    os.environ["MTLAB_CACHE"] = tempfile.mkdtemp(prefix="mtlab-test-cache-")
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# A test run leaves the checkout as it found it: Hypothesis keeps its files (the constants it finds in the
# code) in a temporary folder, never in .hypothesis/ of the working directory.
set_hypothesis_home_dir(os.path.join(os.environ["MTLAB_CACHE"], "hypothesis"))

# Property tests: derandomized in CI, so a failure CI finds reproduces with the same command, with a bounded
# number of examples (tests scale their budget from ``settings.default.max_examples``) and shrink time.
# ``HYPOTHESIS_PROFILE=long python -m pytest tests/integration/test_properties.py`` searches at random, 40x longer.
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


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few utterances of data_samples/ with absolute-path lists (``helpers.recipes.make_tiny_corpus``)."""
    from helpers.recipes import make_tiny_corpus

    return make_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt while the test runs, however the suite was started: a shell starts a
    background job (``pytest ... &``) with SIGINT ignored, and a test that sends one would then see nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def one_thread():
    """Tiny models: one torch thread is fastest and avoids oversubscribing shared CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ the fast tier
# `pytest -m "not slow"` is the quick check (under a minute on 2 cores). A test that starts a subprocess,
# kernel, browser, process group or wheel build, or takes over about a second on a quiet 2-core machine,
# carries @pytest.mark.slow itself (a whole module: `pytestmark = pytest.mark.slow`).


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside the slow tier may not start a subprocess: it would make the quick check slow. Mark it
    ``@pytest.mark.slow`` instead."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import subprocess

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a subprocess; mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
