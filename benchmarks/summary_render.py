r"""Opens a run's summary in headless Chromium and checks that it renders.

  python benchmarks/summary_render.py WORKDIR [--chromium chromium]

Loads WORKDIR/summary.html (written by the loop beside summary.md) in
headless Chromium, counts the plots that decoded (an <img> whose
naturalWidth is > 0) and the tables, saves a screenshot as
WORKDIR/summary_screenshot.png, and ends with one line:

  images=N loaded=L tables=T screenshot_colors=C ok=1

`ok=1` when every image loaded, the page has a table, and the screenshot is
not blank; the exit status is 0 then, else 1. Needs Chromium (Debian:
`apt-get install chromium`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

_CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.body.dataset.images = imgs.length;
  document.body.dataset.loaded = imgs.filter(i => i.naturalWidth > 0).length;
  document.body.dataset.tables = document.querySelectorAll("table").length;
});
</script>"""


def _chromium(binary: str, *args: str) -> str:
  proc = subprocess.run(
      [binary, "--headless", "--no-sandbox", "--disable-gpu",
       "--allow-file-access-from-files", "--virtual-time-budget=5000", *args],
      capture_output=True, text=True, timeout=120, check=False,
  )  # fmt: skip
  if proc.returncode != 0:
    raise RuntimeError(f"{binary} failed: {proc.stderr[-2000:]}")
  return proc.stdout


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("workdir")
  p.add_argument("--chromium", default="chromium")
  args = p.parse_args(argv)
  binary = shutil.which(args.chromium)
  if binary is None:
    print(
        f"{args.chromium} not found: install it (apt-get install chromium)"
        " or pass --chromium PATH",
        file=sys.stderr,
    )
    return 2
  page = os.path.join(args.workdir, "summary.html")
  if not os.path.exists(page):
    print(f"{page} does not exist: run spade.main first", file=sys.stderr)
    return 2
  with open(page) as f:
    text = f.read()
  # The probe page sits beside summary.html so the plots' relative paths
  # resolve; it is removed afterwards.
  probe = os.path.join(args.workdir, ".summary_probe.html")
  with open(probe, "w") as f:
    f.write(text.replace("</body>", _CHECK + "</body>"))
  try:
    dom = _chromium(binary, "--dump-dom", "file://" + os.path.abspath(probe))
  finally:
    os.remove(probe)
  found = {
      k: int(v)
      for k, v in re.findall(r'data-(images|loaded|tables)="(\d+)"', dom)
  }
  shot = os.path.join(args.workdir, "summary_screenshot.png")
  with tempfile.TemporaryDirectory() as tmp:
    _chromium(
        binary, f"--screenshot={os.path.join(tmp, 'shot.png')}",
        "--window-size=1200,900", "file://" + os.path.abspath(page),
    )  # fmt: skip
    shutil.copy(os.path.join(tmp, "shot.png"), shot)
  from matplotlib import image  # pylint: disable=g-import-not-at-top

  pixels = image.imread(shot)
  colors = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0]
  images, loaded = found.get("images", 0), found.get("loaded", 0)
  tables = found.get("tables", 0)
  ok = images > 0 and loaded == images and tables > 0 and colors > 50
  print(
      f"images={images} loaded={loaded} tables={tables}"
      f" screenshot_colors={colors} ok={int(ok)}"
  )
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
