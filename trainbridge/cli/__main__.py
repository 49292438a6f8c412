"""`python -m trainbridge.cli ...`: the `trainbridge` command."""

import sys

from . import main

sys.exit(main())
