"""`python -m sparkfleet.simengine ...`: run one sim engine rank (see the package docstring)."""

import sys

from sparkfleet.simengine.main import main

sys.exit(main())
