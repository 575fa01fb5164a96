"""`python -m lab_utils ...`: the lab's command line (see `lab_utils.cli`)."""

import sys

from lab_utils.cli import main

if __name__ == "__main__":
    sys.exit(main())
