from __future__ import annotations

import pytest

from tests.support.fake_openai import FakeOpenAI
from tests.support.inference import OPENAI_CREDENTIAL


@pytest.fixture(scope="module")
def upstream():
    """An OpenAI-compatible upstream whose fault modes the billing tests need."""
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake
