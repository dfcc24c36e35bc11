"""`python -m fleetcanary`: the command line."""
import sys

from fleetcanary.cli import main

sys.exit(main())
