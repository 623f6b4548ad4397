"""The `handles` fixture: each test of the limiters' contract runs once per limiter."""

from __future__ import annotations

import pytest

from tests.ratelimit.limiters import LIMITERS, Handles


@pytest.fixture(params=LIMITERS)
def handles(request):
    opened = Handles(request.param, request)
    yield opened
    opened.close()
