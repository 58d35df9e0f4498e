"""mtlab's error types. Every user-facing error names what to fix."""

from __future__ import annotations


class MtlabError(Exception):
    """Base class of every error mtlab raises on purpose."""


class ConfigError(MtlabError, ValueError):
    """A task, graph, recipe or trainer setting that cannot work."""


class GraphError(ConfigError):
    """A model graph that cannot run (unknown model, dangling input, ...)."""


class PhaseError(MtlabError, RuntimeError):
    """A stepwise call made out of order; the message names the call that should come first."""


class ZeroNormError(MtlabError, ArithmeticError):
    """Normalizing by an accumulated norm of zero."""


class NonFiniteError(MtlabError, FloatingPointError):
    """A non-finite loss or gradient that would have reached the parameters."""


class BatchError(MtlabError, ValueError):
    """A batch or example with missing keys or inconsistent shapes."""


class DataError(MtlabError, ValueError):
    """Bad input data; the message names the file (and line) and what to do about it."""
