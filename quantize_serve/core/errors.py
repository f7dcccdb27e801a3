"""One errors module.

Every error says what failed, with which value, and what to do. Classes also subclass the
standard type a caller would expect (``RecipeError`` is a ``ValueError``), the way
huggingface_hub's errors do, so generic handlers keep working.
"""

from __future__ import annotations


class QuantizeServeError(Exception):
    """Base class of every error this project raises on purpose."""


class RecipeError(QuantizeServeError, ValueError):
    """The recipe (or a file it names) is invalid. Raised before any heavy work starts."""

    def __init__(self, source: str, field: str, value: object, problem: str, fix: str) -> None:
        self.source, self.field, self.value, self.problem, self.fix = source, field, value, problem, fix
        stop = "" if problem.endswith((".", "?", "!")) else "."
        super().__init__(f"{source}: {field} = {_show(value)}: {problem}{stop} Fix: {fix}")

    def with_source(self, source: str) -> RecipeError:
        """The same problem, reported against ``source`` (validators do not know the file name)."""
        return RecipeError(source, self.field, self.value, self.problem, self.fix)


class UnplannableShapeError(RecipeError):
    """A model config the capacity planner has no model of (its architecture, or an attention whose KV
    cache is not KV heads x head_dim per token): vLLM can still measure it (``plan RECIPE --measure``)."""


class RecipeErrors(QuantizeServeError, ValueError):
    """Several recipe problems found at once, reported together."""

    def __init__(self, errors: list[RecipeError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"{len(errors)} problem(s) in the recipe:\n{lines}")


class QuantizationError(QuantizeServeError, RuntimeError):
    """llm-compressor failed in its child process; carries the tail of its output."""


class _ServerError(QuantizeServeError):
    """A vLLM server failure: the message, then the remedy that fits and the log tail."""

    def __init__(self, message: str, *, log_tail: str = "", remedy: str = "") -> None:
        self.log_tail, self.remedy = log_tail, remedy
        text = message
        if remedy:
            text += f"\nRemedy: {remedy}"
        if log_tail:
            text += f"\n--- last lines of the vLLM log ---\n{log_tail}"
        super().__init__(text)


class ServerBootError(_ServerError, RuntimeError):
    """vLLM did not become healthy; carries the log tail and the remedy that fits."""


class ServerUnavailableError(_ServerError, ConnectionError):
    """A booted vLLM server stopped answering (it died, was killed, or hangs); carries the log tail
    and the remedy. A ConnectionError, so handlers of OSError keep working."""


class GateError(QuantizeServeError, RuntimeError):
    """A gate could not run (this is a failure of the gate, never a skip)."""


class HubError(QuantizeServeError, RuntimeError):
    """A Hub call failed; the message says which call, on what, and what to do (never the token)."""


class HubAuthError(HubError, PermissionError):
    """401/403: the token is missing, wrong, or has no write rights on the namespace."""


class HubNotFoundError(HubError, LookupError):
    """404: the repo or revision does not exist (or is private and the token cannot see it)."""


class RefMovedError(HubError):
    """The release ref no longer points where a rollback read it: someone else moved it in between.
    Refused before anything changed."""


class ReleaseRefusedError(QuantizeServeError, ValueError):
    """A rollback target that is not a gated release of the repo (never gated, rejected, unknown)."""


# Mistakes in the input that the person running the pipeline can fix (a recipe, a file it names, a
# Hub repo id, a token): the command line prints them as one screen with the fix and exits 2.
USER_ERRORS: tuple[type[QuantizeServeError], ...] = (
    RecipeError,
    RecipeErrors,
    HubAuthError,
    HubNotFoundError,
    ReleaseRefusedError,
)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
