"""Reading and editing Python source with libcst, below both the port (targets/) and the
rewriters (agent/): positions, scopes, names, imports and span edits.

One module per job: `syntax` (text <-> nodes, comparison by meaning), `shapes` (one operation
however it is spelled), `names` (names read and bound), `scope` (following a local name to its
value), `sites` (functions, statements and their lines), `imports` (a module's imports) and
`edits` (one batch of replacements applied in a single pass)."""
