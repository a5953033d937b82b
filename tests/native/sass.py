"""Finds the built extension and disassembles it with cuobjdump."""

import os
import pathlib
import shutil
import subprocess


def extension_path() -> pathlib.Path:
    from jax_cluster import _ext

    return pathlib.Path(_ext.__file__)


def cuobjdump() -> str | None:
    """cuobjdump from PATH, or from the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for path in pathlib.Path(root).glob("cu1*/bin/cuobjdump"):
            return str(path)
    return None


def run_on(path, *args: str) -> str:
    """cuobjdump ARGS PATH; the wheel's nvdisasm, which --dump-sass needs, sits beside it."""
    tool = cuobjdump()
    env = dict(os.environ, PATH=str(pathlib.Path(tool).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([tool, *args, str(path)], check=True, capture_output=True, text=True, env=env).stdout


def run(*args: str) -> str:
    return run_on(extension_path(), *args)
