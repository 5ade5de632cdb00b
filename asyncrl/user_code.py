"""The user's code, imported by name: `"package.module"` or `"path/to/file.py"`.

Shared by every key that names a user function (`reward.custom_function`,
`rollout.multi_turn.episode`); each caller turns a failure into its own one-line error naming
its key. A file is registered in `sys.modules` under `prefix` + its stem, so its functions
pickle by reference in this process.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType


def import_module_or_file(where: str, prefix: str) -> ModuleType:
    """The module `where` names: a file when it ends in .py or holds a path separator, else a
    module name. Raises what the import raises (ImportError for a missing file)."""
    if not (where.endswith(".py") or os.sep in where):
        return importlib.import_module(where)
    if not os.path.isfile(where):
        raise ImportError(f"no such file: {where}")
    module_name = prefix + os.path.splitext(os.path.basename(where))[0]
    spec = importlib.util.spec_from_file_location(module_name, os.path.abspath(where))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
