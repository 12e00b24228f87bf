"""Old import paths of modules that moved in 0.4 (docs/versioning.md#moved-modules).

`import agenttasks.signatures` still works and warns once with the new path. Jobs and schedules
that django-q2 stored before an upgrade name their function by its old path
(`agenttasks.worker.execute_run`), so the old paths must keep resolving until they are gone from
every queue. This module imports nothing from Django: a receiver that is not a Django site may
still import `agenttasks.signatures`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "agenttasks.answers": "agenttasks.lifecycle.answers",
    "agenttasks.callbacks": "agenttasks.delivery.callbacks",
    "agenttasks.deadlines": "agenttasks.runtime.deadlines",
    "agenttasks.deliveries": "agenttasks.delivery.outbox",
    "agenttasks.deltas": "agenttasks.broker.deltas",
    "agenttasks.files": "agenttasks.store.files",
    "agenttasks.forking": "agenttasks.execution.forking",
    "agenttasks.health": "agenttasks.operations.health",
    "agenttasks.listen": "agenttasks.broker.listen",
    "agenttasks.metrics": "agenttasks.operations.metrics",
    "agenttasks.progress": "agenttasks.lifecycle.progress",
    "agenttasks.queue": "agenttasks.broker.queue",
    "agenttasks.reaper": "agenttasks.execution.reaper",
    "agenttasks.retention": "agenttasks.operations.retention",
    "agenttasks.signatures": "agenttasks.delivery.signatures",
    "agenttasks.wakeups": "agenttasks.delivery.wakeups",
    "agenttasks.worker": "agenttasks.execution.worker",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolve an old module path to the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed in 1.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module):
        """Do nothing: the module at the new path is already executed."""


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
