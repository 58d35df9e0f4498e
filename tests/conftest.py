import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """Tiny models: one torch thread is fastest and avoids oversubscribing shared CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ the fast tier
# `pytest -m "not slow"` is the quick check (under a minute on 2 cores). Whole modules that start kernels,
# browsers, process groups or wheel builds are slow here; single tests elsewhere carry @pytest.mark.slow.
SLOW_MODULES = {
    "browser/test_jupyterlab.py", "test_notebooks.py", "ui/test_kernel.py", "ui/test_notebook_outputs.py",
    "test_wheel.py", "test_distributed.py", "test_distributed_agree.py", "test_distributed_elastic.py",
}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


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
