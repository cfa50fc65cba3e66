"""The one error type for bad input: a shape, knob or name that splitlab refuses.

It is a ``ValueError`` so that callers catching the standard type keep working; the CLI turns it
into a one-line message and exit code 2.
"""

from __future__ import annotations

from collections.abc import Iterable


class SplitlabError(ValueError):
    """A bad argument, named, with what is allowed."""


def bad(arg: str, value: object, allowed: str) -> SplitlabError:
    """Build the standard message: ``<arg>=<value!r> is not allowed; expected <allowed>``."""
    return SplitlabError(f"{arg}={value!r} is not allowed; expected {allowed}")


def check_int(arg: str, value: object, *, minimum: int | None = 1, maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer (not a bool) in ``[minimum, maximum]`` (either bound
    may be None: open); raise naming ``arg`` and the range otherwise."""
    allowed = _int_range(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        # Integral floats and numpy integers from a result row are accepted; 1.5, nan and inf are not.
        try:
            as_int = int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise bad(arg, value, allowed) from None
        if isinstance(value, bool) or as_int != value:
            raise bad(arg, value, allowed)
    else:
        as_int = value
    if (minimum is not None and as_int < minimum) or (maximum is not None and as_int > maximum):
        raise bad(arg, value, allowed)  # the value as given (1e+30, not its 31 digits)
    return as_int


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    return "an integer" + (f" <= {maximum}" if maximum is not None else "")


def check_choice(arg: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; raise naming them otherwise."""
    choices = list(choices)
    if value not in choices:
        raise bad(arg, value, "one of " + ", ".join(choices))
    return value  # type: ignore[return-value]
