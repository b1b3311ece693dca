"""``uni demo --timeline FILE.png``: a Gantt chart of each block's read, compute and write spans.

matplotlib comes with the ``bench`` extra; callers check ``missing()`` before importing this
module's drawing side, so a user without it gets a sentence, not a traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from uni._app._pipeline import STAGES, RunResult

COLOURS = {"read": "#4c72b0", "compute": "#dd8452", "write": "#55a868"}


def missing() -> str | None:
    """None when matplotlib is installed, else what to do about it."""
    if importlib.util.find_spec("matplotlib") is None:
        return "--timeline needs matplotlib; install it with: pip install 'uni[bench]'"
    return None


def _stage_spans(run: RunResult) -> dict[tuple[int, str], tuple[float, float]]:
    """One bar per (block, stage): from its first operation's start to its last one's end."""
    bars: dict[tuple[int, str], tuple[float, float]] = {}
    for span in run.spans:
        key = (span.block, span.stage)
        start, end = bars.get(key, (span.start, span.end))
        bars[key] = (min(start, span.start), max(end, span.end))
    return bars


def draw(path: str, runs: Sequence[tuple[str, RunResult]], blocks: int) -> None:
    """Write a PNG with one Gantt panel per run (same time axis), blocks top to bottom."""
    from matplotlib.figure import Figure  # optional (the bench extra): only when drawing
    from matplotlib.patches import Patch  # optional, as above

    height = min(2.0 + 0.18 * blocks, 9.0)
    fig = Figure(figsize=(10, height * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, run) in zip(axes, runs, strict=True):
        bars = _stage_spans(run)
        for (block, stage), (start, end) in bars.items():
            lane = STAGES.index(stage)
            ax.broken_barh([(start, max(end - start, 1e-6))], (block + lane * 0.3 - 0.45, 0.28),
                           facecolors=COLOURS[stage])
        ax.set_ylim(blocks - 0.4, -0.6)
        ax.set_ylabel("block")
        ax.set_title(f"{title}: {run.wall_s:.2f} s")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds since the run started")
    handles = [Patch(color=COLOURS[s], label=s) for s in STAGES]
    axes[0].legend(handles=handles, loc="upper right", ncols=len(STAGES))
    fig.savefig(path, dpi=110)
