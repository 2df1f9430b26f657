"""Test harness: 8 fake CPU devices and the `slow` / `sandbox` markers.

XLA reads the device count once, at backend start, so it is set here before
anything imports jax.
"""

import os
import shutil

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # pylint: disable=g-import-not-at-top


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long test (minutes)")
  config.addinivalue_line(
      "markers", "sandbox: needs gVisor's runsc (apt-get install runsc)"
  )


def pytest_collection_modifyitems(config, items):
  del config
  if shutil.which("runsc"):
    return
  # Without runsc the sandbox tests cannot run; fail loudly under CI rather
  # than pass by skipping, since CI's set-up installs runsc.
  if os.environ.get("CI"):
    return
  skip = pytest.mark.skip(reason="runsc not installed: apt-get install runsc")
  for item in items:
    if "sandbox" in item.keywords:
      item.add_marker(skip)
