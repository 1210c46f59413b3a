"""`python -m fleetserve_runtime serve ...`."""

from fleetserve_runtime.cli import main

raise SystemExit(main())
