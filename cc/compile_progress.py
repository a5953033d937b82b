"""Compiler launcher for the kernel units, so that a first build of the menu
(minutes per unit) says how far it is.

CMake runs every kernel unit's compile as
compile_progress.py UNITS_FILE COMPILER ARGS...
(UNITS_FILE lists the build's units, one path a line). It runs the compiler,
then prints "[jax_cluster] compiled unit 3/17 in 88 s: NAME": after the
compile, because Ninja shows a command's output only once it ends.
"""

import pathlib
import subprocess
import sys
import time


def main() -> int:
    units = [pathlib.Path(line).stem for line in pathlib.Path(sys.argv[1]).read_text().splitlines()]
    command = sys.argv[2:]
    name = next((pathlib.Path(a).stem for a in command if a.endswith(".cu")), "")
    where = f"unit {units.index(name) + 1}/{len(units)}" if name in units else "a unit"
    start = time.monotonic()
    rc = subprocess.call(command)
    done = "compiled" if rc == 0 else "failed to compile"
    print(f"[jax_cluster] {done} {where} in {time.monotonic() - start:.0f} s: {name}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
