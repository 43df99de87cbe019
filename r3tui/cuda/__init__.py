"""The CUDA driver (through cuda.bindings) and the fixed-address arena, below both the
recorders (``r3tui.record``) and the replay (``r3tui.replay``), which each use them."""
