"""The user's code, imported by name: `"package.module"` or `"path/to/file.py"`.

Shared by every key that names a user function (`reward.custom_function`,
`rollout.multi_turn.episode`, `rollout.agent.entrypoint`); each caller turns a failure into its own
one-line error naming its key. A file is registered in `sys.modules` under `prefix` + its stem, so its functions
pickle by reference in this process.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from asyncrl.errors import ConfigError


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


def import_function(spec: str, key: str, prefix: str) -> tuple[Any, str, str]:
    """`spec` ("package.module:name" or "path/to/file.py:name") imported: (the module's attribute
    `name`, or None where it has none; the module part; the name). A spec without both parts, or a
    module that fails to import, is one ConfigError naming `key`; the caller checks the attribute."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"{key} must look like 'package.module:function' or 'file.py:function', got {spec!r}")
    try:
        module = import_module_or_file(where, prefix)
    except Exception as exc:  # a user's module can fail to import in any way
        raise ConfigError(f"{key}={spec!r}: cannot import {where!r} ({type(exc).__name__}: {exc})") from exc
    return getattr(module, name, None), where, name
