"""Surfaces whose dependencies load on first use: a view whose module is imported by its first
request, and whether an optional package is installed without importing it.

`manage.py` commands, `check` and every worker start load the URL patterns; importing MCP's and
A2A's wire types there cost most of a second of CPU that only their requests need.
"""

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from django.views.decorators.csrf import csrf_exempt


def installed(module: str) -> bool:
    """Say whether a module can be imported, without importing it (None in sys.modules: no)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def view(module: str, name: str, **initkwargs: Any) -> Callable:
    """Return a view that imports `module` and builds `name.as_view(**initkwargs)` on its first
    request. CSRF-exempt, as the API's views are (they authenticate every request)."""
    built: list[Callable] = []

    @csrf_exempt
    def dispatch(request, *args, **kwargs):
        if not built:
            built.append(getattr(importlib.import_module(module), name).as_view(**initkwargs))
        return built[0](request, *args, **kwargs)

    dispatch.__name__ = dispatch.__qualname__ = name
    return dispatch
