"""Placeholder: replaced by the full graph-capture switch at merge."""
import contextlib

_EXPORTABLE = False


def is_exportable() -> bool:
    """Whether the project's export tools have set the exportable switch."""
    return _EXPORTABLE


def set_exportable(flag: bool) -> None:
    """Set the exportable switch."""
    global _EXPORTABLE
    _EXPORTABLE = bool(flag)


@contextlib.contextmanager
def exportable(flag: bool = True):
    """The exportable switch set to ``flag`` inside the ``with`` block."""
    old = _EXPORTABLE
    set_exportable(flag)
    try:
        yield
    finally:
        set_exportable(old)
