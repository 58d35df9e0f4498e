"""Experiment loggers: CSV, TensorBoard, MLflow and trackio behind one listener interface.

A logger is a listener ``logger(event, info)`` with ``close()``, registered on a trainer::

    from mtlab.loggers import make
    logger = make("tensorboard", "exp/demo").attach(trainer)   # trainer.add_callback(logger)
    ...                                                          # train
    logger.close()

What is logged, with the optimizer step as the step axis (never the minibatch count):

- after every ``apply``: the step's history row under ``train/``: ``<task>/loss`` (Σloss/Σnorm over
  the whole step, so it does not change with ``numbatches_to_aggregate``), ``<task>/<linkedset>/loss``,
  ``lr``, ``<task>/grad_norm``, ``<task>/grad_norm_clipped``, ``<task>/clip_fraction``, the task and
  linked-set weights, ``skipped``;
- on ``validation`` (``info["record"]``, from the training loop): the validation record under ``valid/``;
- on ``run_end``: everything still buffered is written.

Rows are buffered and written every ``flush_every`` steps, so logging adds no device sync to a step.
``pip install "mtlab[loggers]"`` installs TensorBoard, MLflow and trackio.
"""

from __future__ import annotations

import csv
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import ConfigError

if TYPE_CHECKING:
    from ..core.trainer import Trainer

EXTRA_HINT = 'pip install "mtlab[loggers]"'
_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")  # characters MLflow refuses in a metric name (e.g. "," of "a,b")
NAMES = ("csv", "tensorboard", "mlflow", "trackio")


def _need(module: str, logger: str) -> Any:
    """Import an optional logger package, or raise ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"the {logger} logger needs the package {module!r}: {EXTRA_HINT}") from err


def _scalar(value: Any) -> float | None:
    """A loggable float, or None for values that are not one number (texts, lists, missing)."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def scalars(row: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numeric entries of a history row or validation record as ``{prefix/key: value}`` (``step`` left out)."""
    out = {}
    for key, value in row.items():
        if key == "step":
            continue
        number = _scalar(value)
        if number is not None:
            out[f"{prefix}/{key}"] = number
    return out


class Logger:
    """Base listener: buffers history rows, writes scalars through :meth:`write` (one call per step)."""

    name = "logger"

    def __init__(self, flush_every: int = 10) -> None:
        if flush_every < 1:
            raise ConfigError(f"{type(self).__name__}: flush_every must be >= 1, got {flush_every}")
        self.flush_every = flush_every
        self.trainer: Trainer | None = None
        self._pending: list[Any] = []  # history rows, or their index in trainer.log when the event has no row
        self.closed = False

    def attach(self, trainer: Trainer) -> Logger:
        """Listen to ``trainer`` (``trainer.add_callback(self)``); returns self."""
        self.trainer = trainer
        trainer.add_callback(self)
        return self

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        if self.closed:
            return
        if event == "apply":
            row = info.get("row")
            if row is None:
                if self.trainer is None:
                    raise ConfigError(f"{type(self).__name__}: the 'apply' event carries no history row; register "
                                      "the logger with logger.attach(trainer) so it can read trainer.log")
                row = len(self.trainer.log) - 1
            self._pending.append(row)
            if len(self._pending) >= self.flush_every:
                self.flush()
        elif event == "restore":
            # go_back cut the history: buffered rows of the undone steps are gone with it.
            step = int(info.get("step", 0))
            size = len(self.trainer.log) if self.trainer is not None else None

            def kept(r: Any) -> bool:
                if isinstance(r, int):
                    return size is None or r < size
                return int(_scalar(r["step"]) or 0) <= step

            self._pending = [r for r in self._pending if kept(r)]
        elif event == "validation":
            self.flush()
            record = info.get("record") or {}
            step = int(info.get("step", record.get("step", 0)))
            values = scalars(record, "valid")
            if values:
                self.write(step, values)
        elif event == "run_end":
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows (one read of the history: one device sync for all of them)."""
        if not self._pending:
            return
        # Reading the history turns every pending tensor of its rows (the same dicts the events carried)
        # into a float in one transfer, instead of one .item() per value below.
        rows = self.trainer.log.rows() if self.trainer is not None else []
        pending, self._pending = self._pending, []
        for item in pending:
            row = rows[item] if isinstance(item, int) else item
            self.write(int(_scalar(row["step"]) or 0), scalars(row, "train"))
        self.sync()

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at optimizer step ``step`` (subclasses)."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make what was written visible (subclasses that buffer)."""

    def close(self) -> None:
        """Write what is buffered, release the backend and stop listening."""
        if self.closed:
            return
        self.flush()
        self._close()
        self.closed = True
        if self.trainer is not None:
            self.trainer.remove_callback(self)

    def _close(self) -> None:
        """Release the backend (subclasses)."""

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CSVLogger(Logger):
    """``<logdir>/scalars.csv`` with one ``step,tag,value`` line per scalar (tags may come and go)."""

    name = "csv"

    def __init__(self, logdir: str | Path, flush_every: int = 10, filename: str = "scalars.csv") -> None:
        super().__init__(flush_every)
        self.path = Path(logdir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = self.path.open("a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["step", "tag", "value"])

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at optimizer step ``step``."""
        for tag, value in values.items():
            self._writer.writerow([step, tag, repr(value)])

    def sync(self) -> None:
        """Make what was written visible (flush to its store)."""
        self._file.flush()

    def _close(self) -> None:
        self._file.close()


class TensorBoardLogger(Logger):
    """TensorBoard event files in ``<logdir>/tensorboard`` (``torch.utils.tensorboard``)."""

    name = "tensorboard"

    def __init__(self, logdir: str | Path, flush_every: int = 10, subdir: str = "tensorboard") -> None:
        super().__init__(flush_every)
        _need("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(logdir) / subdir
        self._writer = SummaryWriter(str(self.path))

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at optimizer step ``step``."""
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def sync(self) -> None:
        """Make what was written visible (flush to its store)."""
        self._writer.flush()

    def _close(self) -> None:
        self._writer.close()


class MLflowLogger(Logger):
    """An MLflow run in a local store: ``sqlite:///<logdir>/mlflow.db`` unless ``tracking_uri`` says otherwise.

    MLflow 3 refuses new plain-folder (``./mlruns``) stores by default, so the local default is an SQLite
    file; ``mlflow ui --backend-store-uri sqlite:///<logdir>/mlflow.db`` shows it. Nothing goes online. The run's
    id is kept in ``<logdir>/mlflow_run_id``, so a logger made again for the same folder (a resumed experiment)
    continues that run instead of opening a second one.
    """

    name = "mlflow"
    RUN_FILE = "mlflow_run_id"  # in the experiment folder: `mtlab resume` continues the same run

    def __init__(self, logdir: str | Path, flush_every: int = 10, experiment: str = "mtlab", run_name: str | None = None,
                 tracking_uri: str | None = None, params: Mapping[str, Any] | None = None) -> None:
        super().__init__(flush_every)
        _need("mlflow", "mlflow")
        _need("sqlalchemy", "mlflow")
        from mlflow.tracking import MlflowClient

        self.path = Path(logdir)
        self.path.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = tracking_uri or f"sqlite:///{(self.path / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
        else:
            artifacts = (self.path / "mlflow-artifacts").resolve().as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        self.run_id = self._continued_run() or self.client.create_run(self.experiment_id, run_name=run_name).info.run_id
        (self.path / self.RUN_FILE).write_text(self.run_id + "\n")
        self._metrics: list[Any] = []
        if params:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(str(k), str(v)[:500]) for k, v in params.items()])

    def _continued_run(self) -> str | None:
        """The run this folder logged to before (a resumed experiment continues it), reopened; else None."""
        saved = self.path / self.RUN_FILE
        if not saved.is_file():
            return None
        run_id = saved.read_text().strip()
        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 (MLflow raises its own error for an unknown run: start a new one)
            return None
        if run.info.experiment_id != self.experiment_id:
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at optimizer step ``step``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._metrics.extend(Metric(_MLFLOW_BAD.sub("_", tag), value, now, step) for tag, value in values.items()
                             if not math.isnan(value))

    def sync(self) -> None:
        # log_batch takes at most 1000 metrics a call.
        """Make what was written visible (flush to its store)."""
        while self._metrics:
            batch, self._metrics = self._metrics[:1000], self._metrics[1000:]
            self.client.log_batch(self.run_id, metrics=batch)

    def _close(self) -> None:
        self.sync()
        self.client.set_terminated(self.run_id)


class TrackioLogger(Logger):
    """A trackio run (local SQLite store in trackio's folder, ``$TRACKIO_DIR``; ``trackio show`` displays it)."""

    name = "trackio"

    def __init__(self, logdir: str | Path, flush_every: int = 10, project: str = "mtlab", run_name: str | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        super().__init__(flush_every)
        self._trackio = _need("trackio", "trackio")
        self.path = Path(logdir)
        self.project = project
        self.run = self._trackio.init(project=project, name=run_name, config=dict(config or {}), embed=False)
        self.run_name = self.run.name

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` at optimizer step ``step``."""
        self.run.log(dict(values), step=step)

    def _close(self) -> None:
        self.run.finish()


class LoggerGroup(Logger):
    """Several loggers as one listener."""

    name = "group"

    def __init__(self, loggers: Sequence[Logger]) -> None:
        super().__init__(1)
        self.loggers = list(loggers)

    def attach(self, trainer: Trainer) -> LoggerGroup:
        """Attach every logger of the group to ``trainer``."""
        self.trainer = trainer
        for lg in self.loggers:
            lg.trainer = trainer
        trainer.add_callback(self)
        return self

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            lg(event, info)

    def flush(self) -> None:
        """Write every logger's buffered rows."""
        for lg in self.loggers:
            lg.flush()

    def _close(self) -> None:
        for lg in self.loggers:
            lg.close()


_CLASSES: dict[str, type[Logger]] = {"csv": CSVLogger, "tensorboard": TensorBoardLogger, "mlflow": MLflowLogger,
                                     "trackio": TrackioLogger}


def make(spec: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]], logdir: str | Path) -> Logger:
    """A logger from a name (``"csv"``, ``"tensorboard"``, ``"mlflow"``, ``"trackio"``), a table
    ``{"type": "mlflow", "experiment": "sep"}`` (other keys go to the logger), a comma-separated string or a
    list of these (one :class:`LoggerGroup`). Files go under ``logdir``.

    Examples:
        >>> make("csv,tensorboard", "exp/demo").attach(trainer)  # doctest: +SKIP
    """
    if isinstance(spec, str) and "," in spec:
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        if not spec:
            raise ConfigError(f"no logger named; choose from {', '.join(NAMES)}")
        return LoggerGroup([make(s, logdir) for s in spec])
    options: dict[str, Any] = {}
    if isinstance(spec, Mapping):
        options = dict(spec)
        if "type" not in options:
            raise ConfigError(f"logger table {dict(spec)!r} needs type = one of {', '.join(NAMES)}")
        spec = options.pop("type")
    name = str(spec).lower()
    if name not in _CLASSES:
        raise ConfigError(f"unknown logger {spec!r}; choose from {', '.join(NAMES)}")
    import inspect

    cls: Any = _CLASSES[name]  # a Logger subclass; its constructor's options differ by kind
    try:
        inspect.signature(cls).bind(logdir, **options)
    except TypeError as err:
        raise ConfigError(f"logger {name!r}: {err}; see mtlab.loggers.{cls.__name__} for its options") from err
    return cls(logdir, **options)
