"""``python -m fleetserve_e2e``: see :mod:`fleetserve_e2e.cli`."""

from fleetserve_e2e.cli import main

main()
