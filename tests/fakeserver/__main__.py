"""``python -m tests.fakeserver``: the same command line as ``python -m tests.helpers.fakeserver``."""

import sys

from tests.helpers.fakeserver import main

sys.exit(main())
