"""Named fault points of the commit and retention: ``set_fault_hook`` installs a callback invoked at
each (crash tests kill the writer there); a no-op by default."""

from __future__ import annotations

from collections.abc import Callable

FaultHook = Callable[[str], None]
_fault_hook: FaultHook | None = None


def set_fault_hook(hook: FaultHook | None) -> None:
    """Install ``hook(point)`` called at each named point of the commit protocol (tests only)."""
    global _fault_hook
    _fault_hook = hook


def fault_hook_installed() -> bool:
    """True while a fault hook is installed (a persist process then forwards its fault points)."""
    return _fault_hook is not None


def fault(point: str) -> None:
    """Reach the named fault point (calls the installed hook, if any)."""
    if _fault_hook is not None:
        _fault_hook(point)
