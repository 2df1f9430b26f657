"""The one error type of the sandbox package."""


class SandboxError(Exception):
  """A sandbox operation that failed.

  Attributes:
    reason: a short code ("not_installed", "config", "start", "timeout",
      "crash", "call_timeout", "output_too_large", "closed", "sandbox_lost",
      "exception", a validator/loader reason, ...).
    message: what happened and what to do.
  """

  def __init__(self, reason: str, message: str):
    super().__init__(f"{reason}: {message}")
    self.reason = reason
    self.message = message
