# Overrides module globals from --key=value arguments (single-file-trainer style).
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    key, val = arg.removeprefix("--").split("=", 1)
    assert key in globals(), f"unknown config key {key}"
    try:
        val = literal_eval(val)
    except (SyntaxError, ValueError):
        pass
    globals()[key] = val
