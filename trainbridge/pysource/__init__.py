"""Reading and editing Python source with libcst, below both the port (targets/) and the
rewriters (agent/): positions, scopes, names, imports and span edits."""
