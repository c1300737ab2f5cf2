"""The fake OpenAI-compatible server under its older import path.

The server lives in :mod:`tests.helpers.fakeserver`; this package keeps
``python -m tests.fakeserver --port 0`` and ``from tests.fakeserver import FakeServer``
working for scripts and notes written against that path.
"""

from tests.helpers.fakeserver import *  # noqa: F401,F403
from tests.helpers.fakeserver import CLOSE, INVALID_JSON, main  # noqa: F401
