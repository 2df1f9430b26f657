"""What a run says it did: per-iteration summaries, `summary.md`, plots.

At the end of each iteration the loop prints a short summary (each design's
class name, valid or the reason it failed, the prompt example it nearly
copies if it does, and for a played one its returns, regret, designer
reward and first observation; returns with and without the hint; regret;
rows with signal) and appends the same, as markdown, to
WORKDIR/summary.md. From the second iteration on, `plots(workdir)` draws
WORKDIR/plots/validity.png, regret.png and returns.png from metrics.jsonl,
and summary.md shows them;
`write_html` renders the same as WORKDIR/summary.html for a browser.
At the end of the run, `footer` says where the programs, transcripts,
metrics and TensorBoard logs are and which commands read them.
"""

from __future__ import annotations

import functools
import html as html_lib
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from spade.designer import examples as examples_lib
from spade.memory import dedup
from spade.selfplay import records

SUMMARY_FILE = "summary.md"
PLOTS_DIR = "plots"
# metrics.jsonl keys drawn, one PNG each: (file, title, [(key, label)]).
PLOTS = (
    ("validity", "designs valid", [("designer/valid_rate", "valid rate")]),
    ("regret", "regret", [("regret/mean", "mean regret")]),
    (
        "returns",
        "agent return",
        [
            ("agent/return_nohint", "without hint"),
            ("agent/return_hint", "with hint"),
        ],
    ),
)


@functools.lru_cache(maxsize=1)
def _example_signatures() -> tuple[tuple[str, Any, str | None], ...]:
  return tuple(
      (family, dedup.minhash(code), dedup.ast_fingerprint(code))
      for family, code in examples_lib.BY_FAMILY.items()
  )


def near_copy_of(code: str, threshold: float) -> str | None:
  """The prompt example (its family's name) `code` nearly copies, or None:
  the same AST fingerprint, or MinHash similarity >= `threshold` (the
  memory's near-duplicate rule)."""
  if not code.strip():
    return None
  signature, fingerprint = dedup.minhash(code), dedup.ast_fingerprint(code)
  best, name = 0.0, None
  for family, other, other_print in _example_signatures():
    if fingerprint is not None and fingerprint == other_print:
      return family
    s = float(dedup.similarity(signature, other[None])[0])
    if s > best:
      best, name = s, family
  return name if best >= threshold else None


def design_rows(
    designs: Sequence[records.Design],
    threshold: float,
    earned: Mapping[int, Mapping[str, float | None]] | None = None,
) -> list[dict[str, Any]]:
  """One row per design: index, class name, verdict, near-copy and, for a
  design that was played, what it earned (`earned[index]`: its returns
  without and with the hint, regret, designer reward)."""
  earned = earned or {}
  rows = []
  for d in designs:
    name = str(d.verdict.details.get("class_name") or "") or "-"
    verdict = "valid"
    if not d.valid:
      first = d.verdict.message.strip().splitlines()
      why = first[0][:80] if first else ""
      verdict = f"{d.verdict.reason}" + (f": {why}" if why else "")
    rows.append(
        dict(
            index=d.index,
            name=name,
            verdict=verdict,
            copy=near_copy_of(d.code, threshold) if d.code else None,
            attempts=d.attempt + 1,
            earned=earned.get(d.index),
        )
    )
  return rows


def _f(x: float | None) -> str:
  return "-" if x is None else f"{x:.2f}"


def iteration_lines(
    step: int, rows: Sequence[Mapping[str, Any]], m: Mapping[str, float]
) -> list[str]:
  """The console's summary of iteration `step` (1-based)."""
  out = [
      f"iteration {step}: return {_f(m['agent/return_nohint'])} without"
      f" hint, {_f(m['agent/return_hint'])} with; regret"
      f" {m['regret/mean']:.3f}; {int(m['train/rows_with_signal'])} of"
      f" {int(m['train/rows_total'])} rows with signal;"
      f" {m['time/iteration_s']:.0f}s"
  ]
  for r in rows:
    copy = f", near-copy of the {r['copy']} example" if r["copy"] else ""
    out.append(
        f"  design {r['index']}: {r['name']}: {r['verdict']}{copy}"
        + _earned_text(r.get("earned"))
    )
  return out


def shown_text(observation: str | None, limit: int = 70) -> str:
  """A first observation on one line, at most `limit` characters."""
  if not observation:
    return ""
  text = " ".join(str(observation).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _earned_text(e: Mapping[str, Any] | None) -> str:
  if not e:
    return ""
  shows = shown_text(e.get("shows"))
  return (
      f"; played: return {_f(e['return_nohint'])} without hint,"
      f" {_f(e['return_hint'])} with, regret {e['regret']:.3f}, designer"
      f" reward {e['reward']:.3f}" + (f"; shows {shows!r}" if shows else "")
  )


def iteration_markdown(
    step: int,
    rows: Sequence[Mapping[str, Any]],
    m: Mapping[str, float],
    folder: str | None,
) -> str:
  """The same summary as a summary.md section."""
  lines = [f"## Iteration {step}", ""]
  lines.append("| return without hint | with hint | regret | rows with"
               " signal | seconds |")  # fmt: skip
  lines.append("|---|---|---|---|---|")
  lines.append(
      f"| {_f(m['agent/return_nohint'])} | {_f(m['agent/return_hint'])} |"
      f" {m['regret/mean']:.3f} | {int(m['train/rows_with_signal'])} /"
      f" {int(m['train/rows_total'])} | {m['time/iteration_s']:.0f} |"
  )
  if rows:
    lines += [
        "",
        "| design | class | verdict | near-copy of | attempts | return"
        " without hint | with hint | regret | designer reward | first"
        " observation |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
      verdict = str(r["verdict"]).replace("|", "\\|")
      e = r.get("earned") or {}
      shows = shown_text(e.get("shows")).replace("|", "\\|")
      played = (
          f"{_f(e['return_nohint'])} | {_f(e['return_hint'])} |"
          f" {e['regret']:.3f} | {e['reward']:.3f} | {shows or '-'}"
          if e
          else "- | - | - | - | -"
      )
      lines.append(
          f"| {r['index']} | `{r['name']}` | {verdict} |"
          f" {r['copy'] or '-'} | {r['attempts']} | {played} |"
      )
  if folder:
    lines += ["", f"Programs, verdicts and transcripts: `{folder}`"]
  return "\n".join(lines) + "\n\n"


def write_summary(workdir: str, step: int, section: str, *, title: str) -> str:
  """Keeps iteration `step`'s section (WORKDIR/summary/iter_NNNNNN.md) and
  rebuilds WORKDIR/summary.md: `title`, the plots when drawn, then every
  kept section in order (so a resumed run's summary is whole)."""
  folder = os.path.join(workdir, "summary")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f"iter_{step:06d}.md"), "w") as f:
    f.write(section)
  parts = [f"# {title}\n\n"]
  drawn = [
      name
      for name, _, _ in PLOTS
      if os.path.exists(os.path.join(workdir, PLOTS_DIR, f"{name}.png"))
  ]
  if drawn:
    parts.append(
        " ".join(f"![{n}]({PLOTS_DIR}/{n}.png)" for n in drawn) + "\n\n"
    )
  for name in sorted(os.listdir(folder)):
    if name.startswith("iter_") and name.endswith(".md"):
      with open(os.path.join(folder, name)) as f:
        parts.append(f.read())
  path = os.path.join(workdir, SUMMARY_FILE)
  with open(path, "w") as f:
    f.write("".join(parts))
  return path


def plots(workdir: str, history: Sequence[Mapping[str, float]]) -> list[str]:
  """Draws the PLOTS from the run's metrics (one dict per iteration, with
  "step"); returns the written paths, none before two iterations."""
  if len(history) < 2:
    return []
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  folder = os.path.join(workdir, PLOTS_DIR)
  os.makedirs(folder, exist_ok=True)
  steps = np.array([h["step"] for h in history])
  paths = []
  for name, title, series in PLOTS:
    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    for key, label in series:
      ys = np.array([h.get(key, np.nan) for h in history], float)
      ax.plot(steps, ys, marker="o", label=label)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
      ax.legend()
    fig.tight_layout()
    path = os.path.join(folder, f"{name}.png")
    fig.savefig(path)
    plt.close(fig)
    paths.append(path)
  return paths


def footer(
    workdir: str,
    last_folder: str | None,
    example: str | None,
    have_plots: bool,
) -> str:
  """Where the run's products are and the commands that read them."""
  plots_dir = os.path.join(workdir, PLOTS_DIR)
  lines = [
      f"run written to {workdir}:",
      f"  summary           {os.path.join(workdir, SUMMARY_FILE)}"
      + (f" (plots in {plots_dir}/)" if have_plots else ""),
      f"  metrics           {os.path.join(workdir, 'metrics.jsonl')};"
      f" TensorBoard: tensorboard --logdir {workdir}",
  ]
  if last_folder:
    lines.append(
        f"  programs          {last_folder}/ (design_*.py, verdicts.json,"
        " episodes.jsonl: every episode's turns)"
    )
  lines.append(f"  memory            python -m spade.memory.show {workdir}")
  if example:
    lines.append(
        f"  play a design     python -m spade.environments.play {example}"
        f" --workdir {workdir} --show-hint"
    )
  return "\n".join(lines)


def _inline(text: str) -> str:
  """`code` spans of one markdown line as HTML (the rest escaped)."""
  parts = html_lib.escape(text).split("`")
  return "".join(
      f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)
  )


def write_html(workdir: str) -> str:
  """WORKDIR/summary.html: summary.md as one page a browser opens (the
  subset of markdown `write_summary` writes: headings, tables, images,
  paragraphs); returns its path."""
  with open(os.path.join(workdir, SUMMARY_FILE)) as f:
    lines = f.read().splitlines()
  body, table = [], []

  def flush():
    if table:
      rows = [r for r in table if not set(r.replace("|", "").strip()) <= {"-"}]
      cells = [[c.strip() for c in r.strip("|").split(" | ")] for r in rows]
      head = "".join(f"<th>{_inline(c)}</th>" for c in cells[0])
      rest = "".join(
          "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>"
          for r in cells[1:]
      )
      body.append(f"<table><tr>{head}</tr>{rest}</table>")
      table.clear()

  for line in lines:
    if line.startswith("|"):
      table.append(line)
      continue
    flush()
    if line.startswith("## "):
      body.append(f"<h2>{_inline(line[3:])}</h2>")
    elif line.startswith("# "):
      body.append(f"<h1>{_inline(line[2:])}</h1>")
    elif line.startswith("!["):
      for alt, src in re.findall(r"!\[([^\]]*)\]\(([^)]*)\)", line):
        body.append(
            f'<img alt="{html_lib.escape(alt)}" src="{html_lib.escape(src)}">'
        )
    elif line.strip():
      body.append(f"<p>{_inline(line)}</p>")
  flush()
  page = (
      "<!doctype html><html><head><meta charset='utf-8'>"
      "<title>SPADE run</title><style>body{font-family:sans-serif;"
      "margin:2em}table{border-collapse:collapse;margin:1em 0}"
      "td,th{border:1px solid #ccc;padding:2px 8px}</style></head><body>"
      + "\n".join(body)
      + "</body></html>\n"
  )
  path = os.path.join(workdir, "summary.html")
  with open(path, "w") as f:
    f.write(page)
  return path
