"""The primitives: shape rules, autodiff, vmap and sharding of each op, and
their lowering to the FFI call of a kernel plan or to XLA's own ops."""
