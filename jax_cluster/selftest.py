"""`python -m jax_cluster.selftest`: the entry point of `jax_cluster.tools.selftest`."""

import sys

from jax_cluster.tools.selftest import main

if __name__ == "__main__":
    sys.exit(main())
