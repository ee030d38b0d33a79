"""The frameworks an integration needs are optional: ``import coci`` never imports them, and the
integration's module, imported without its framework, raises an ImportError naming coci's extra."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def assert_coci_does_not_import(*packages: str) -> None:
    """``import coci, coci.integrations`` in a fresh interpreter imports none of ``packages``."""
    code = f"import sys, coci, coci.integrations; assert not {set(packages)!r} & set(sys.modules), 'imported'"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr


def assert_missing_package_names_its_extra(monkeypatch: pytest.MonkeyPatch, package: str, module: str, extra: str) -> None:
    """Importing ``module`` while ``package`` cannot be imported raises an ImportError that says
    ``pip install 'coci[extra]'``."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` raise ImportError
    with pytest.raises(ImportError, match=rf"pip install 'coci\[{extra}\]'"):
        importlib.import_module(module)
