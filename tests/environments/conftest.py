"""Shared set-up of the environment tests."""

import pytest

from spade.environments import runtime


@pytest.fixture(autouse=True, scope="session")
def preloaded_modules():
  """Imports numpy and math_verify once, as the sandbox worker does.

  In-process validations then time only the program: on a loaded machine
  the first import of math_verify alone can outlast a validation's budget.
  """
  return runtime.preload()
