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


class ZeroNormalizerError(MtlabError, ArithmeticError):
    """Normalizing by an accumulated normalizer of zero."""


ZeroNormError = ZeroNormalizerError  # the name of release 0.2, kept for code that catches it


class NonFiniteError(MtlabError, FloatingPointError):
    """A non-finite loss or gradient that would have reached the parameters."""


class BatchError(MtlabError, ValueError):
    """A batch or example with missing keys or inconsistent shapes."""


class DataError(MtlabError, ValueError):
    """Bad input data; the message names the file (and line) and what to do about it."""


def explain(exc: BaseException, text: str, instead_of: str | None = None) -> None:
    """Add ``text`` (what a refused call left behind) where a reader sees it: in the message of mtlab's own errors,
    which the dashboard's status line and the command line show as ``str(exc)``, else as a note of ``exc``.
    An earlier explanation that starts with ``instead_of`` is no longer true: ``text`` replaces it."""
    if isinstance(exc, MtlabError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        message = exc.args[0]
        if instead_of:
            message = message.split(f"\n{instead_of}")[0]
        exc.args = (f"{message}\n{text}",)
        return
    notes = getattr(exc, "__notes__", None)
    if instead_of and notes:
        notes[:] = [n for n in notes if not n.startswith(instead_of)]
    exc.add_note(text)
