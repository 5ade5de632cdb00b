"""The configuration: one frozen dataclass per component (`schema.py`), each key declared once
with its type, choices (`names.py`), range and docstring; loading YAML and overrides
(`load.py`), verl's key names (`verl.py`), validation (`validate.py`), and the key listings,
docs and "did you mean" (`keys.py`). Imports no torch: `asyncrl config` and the checks of a
command line run without it.
"""

from asyncrl.config.keys import documented_yaml, field_docs, reference_markdown
from asyncrl.config.load import config_from_dict, config_to_dict, dump_config, load_config, resolve
from asyncrl.config.schema import Config
from asyncrl.config.validate import check_pipeline_keys, validate

__all__ = ["Config", "check_pipeline_keys", "config_from_dict", "config_to_dict", "documented_yaml", "dump_config",
           "field_docs", "load_config", "reference_markdown", "resolve", "validate"]
