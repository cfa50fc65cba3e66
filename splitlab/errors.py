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


def check_int(arg: str, value: object, *, minimum: int | None = 1) -> int:
    """Return ``value`` as an ``int`` if it is an integer (not a bool) ``>= minimum``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        # Integral floats and numpy integers from a result row are accepted; 1.5 is not.
        try:
            as_int = int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise bad(arg, value, "an integer" + (f" >= {minimum}" if minimum is not None else "")) from None
        if isinstance(value, bool) or as_int != value:
            raise bad(arg, value, "an integer" + (f" >= {minimum}" if minimum is not None else ""))
        value = as_int
    if minimum is not None and value < minimum:
        raise bad(arg, value, f"an integer >= {minimum}")
    return value


def check_choice(arg: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; raise naming them otherwise."""
    choices = list(choices)
    if value not in choices:
        raise bad(arg, value, "one of " + ", ".join(choices))
    return value  # type: ignore[return-value]
