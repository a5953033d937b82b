"""The sanitizer test's kernel families (tests/gpu/test_gpu_sanitizer.py)
cover every menu row exactly once, so splitting the tool's runs by family
leaves no kernel unchecked."""

import importlib.util
import pathlib
import re

from jax_cluster.planning import tables

_PATH = pathlib.Path(__file__).parents[1] / "gpu" / "test_gpu_sanitizer.py"


def _families() -> dict:
    spec = importlib.util.spec_from_file_location("gpu_sanitizer", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FAMILIES


def test_every_menu_row_is_in_exactly_one_family():
    families = _families()
    for v in tables.load_menu():
        owners = [name for name, pattern in families.items() if re.search(pattern, v.name)]
        assert len(owners) == 1, (v.name, owners)
