"""The one error attnbench raises for input it cannot take (a leaf module: it imports nothing)."""


class BadInput(ValueError):
    """Input that a kernel cannot take; the message names the parameter and the limit."""


__all__ = ["BadInput"]
