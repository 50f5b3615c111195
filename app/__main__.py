"""`python -m app --api URL` (same as `sd2 ui`)."""

import sys

from app.cli import main

sys.exit(main())
