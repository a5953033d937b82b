"""Finds the built extension and disassembles it with cuobjdump."""
import pathlib
import shutil
import subprocess

import jax_cluster


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


def run(*args: str) -> str:
    tool = cuobjdump()
    env = None
    if tool and "site-packages" in tool:  # the wheel's nvdisasm sits beside it
        import os
        env = dict(os.environ, PATH=str(pathlib.Path(tool).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([tool, *args, str(extension_path())], check=True, capture_output=True,
                          text=True, env=env).stdout
