"""A stand-in for xprof, which tokamax imports at load time for a profiler hook these tests never call."""
