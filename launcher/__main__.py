"""`python -m launcher`: the same as the `sd2` console script."""

import sys

from launcher.cli import main

sys.exit(main())
