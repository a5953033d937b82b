"""Finds the built extension and disassembles it with cuobjdump."""

import os
import pathlib
import re
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


def archs(fatbin_listing: str) -> list[str]:
    """The arch of each ELF a fatbin listing (cuobjdump with no option, or
    -elf of one cubin) names, in contract.json's spelling: "sm90a", "sm100f".
    The extracted cubins' file names drop the family suffix (sm_100f code
    comes out as *.sm_100.cubin), the listing keeps it."""
    found = re.findall(r"(?:arch = |-arch )sm_(\d+[a-z]?)\b", fatbin_listing)
    return [f"sm{a}" for a in found]
