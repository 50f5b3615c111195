"""`python -m sd2`: the library's commands (generate, bench, train, data) without the web stack."""

import sys

from sd2.cli import main

sys.exit(main())
