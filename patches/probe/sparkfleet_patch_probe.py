"""sparkfleet patch probe: a real, minimal patch set.

Bind-mounted into an engine container, importing it prints one line naming the patch set, so a
rank's log shows the set was mounted (the sim engine and the tests use it). It changes nothing else.
"""

import sys

print("sparkfleet patch probe: patch set 'probe' is mounted", file=sys.stderr)
