"""`python -m fleetserve_demo [--exit] [--fast]` (from `e2e/`)."""

import sys

from fleetserve_demo.story import main

sys.exit(main())
