"""After a run: commands that re-measure a recorded run from its folder (`ledger verify`,
`ledger measure`). They sit above the loop and use its timing protocol and acceptance
policy; the ledger package below them only stores and reads events."""
