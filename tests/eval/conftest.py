"""Fixtures for the eval tests: scripted responders and the eval config."""

import pytest

from spade import config as config_lib


class ScriptedResponder:
  """A `Responder` whose reply to each prompt is `reply_fn(messages)`."""

  def __init__(self, reply_fn):
    self.reply_fn = reply_fn
    self.calls = []

  def respond(self, prompts):
    self.calls.append(len(prompts))
    return [self.reply_fn(messages) for messages in prompts]


@pytest.fixture
def scripted():
  """The ScriptedResponder class."""
  return ScriptedResponder


@pytest.fixture
def config():
  """The base config, with the turn limit the suites resolve from it."""
  return config_lib.base_config()
