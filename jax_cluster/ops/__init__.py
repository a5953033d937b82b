"""The public ops: they validate the operands, normalise layouts and bind the
primitives (matmul, dot_general, ragged_dot, linear); quantize makes their
block-scaled fp8 operands."""
