"""Tuning: `autotune` times the candidate plans of a shape on the present
GPU and writes the winner to the cache that the binders read
(`planning.autotune_cache`); `timing` and `accuracy` are its measures."""
