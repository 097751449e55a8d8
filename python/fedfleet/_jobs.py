"""Running a native job (a simulation, a coordinator) from Python: the job runs on a thread of
its own; this thread waits for it in short slices with the GIL released, shows its progress,
and on KeyboardInterrupt (Ctrl-C, a notebook's interrupt) stops it as SIGINT stops the fedfleet
command, waits for it to close its history, and raises the KeyboardInterrupt again."""
from __future__ import annotations

import sys
from typing import Callable, Optional

from . import _core

# How long one wait lasts before Python looks at signals and progress again.
_SLICE_S = 0.1


class _Progress:
    """A tqdm bar when python3-tqdm is there (tqdm.auto: a widget in a notebook), plain lines on
    stderr otherwise, or nothing."""

    def __init__(self, mode, total_rounds: int, label: str):
        self._bar = None
        self._plain = False
        self._total = total_rounds
        if mode is False or mode is None:
            return
        if mode == "plain":
            self._plain = True
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self._plain = True
            return
        self._bar = tqdm(total=total_rounds, desc=label, unit="round", file=sys.stderr)

    def round(self, r: "_core.RoundProgress") -> None:
        if r.round == 0:
            return
        acc = "" if r.test_accuracy is None else f"{100 * r.test_accuracy:.2f}%"
        if self._bar is not None:
            post = {"t": f"{r.end_time:.0f}s"}
            if acc:
                post["acc"] = acc
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)
        elif self._plain:
            parts = [f"round {r.round}/{self._total}", r.status]
            if acc:
                parts.append(f"accuracy {acc}")
            parts.append(f"t={r.end_time:.1f}s")
            parts.append(f"{r.completed} completed")
            print("fedfleet: " + "  ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_job(job: "_core.Job", progress, total_rounds: int, label: str,
            on_round: Optional[Callable[["_core.RoundProgress"], None]] = None) -> None:
    """Runs `job` to its end, or until KeyboardInterrupt (then stops it, waits for it, and
    re-raises). Raises fedfleet.Error when the job failed."""
    bar = _Progress(progress, total_rounds, label)
    job.start()
    try:
        try:
            while not job.wait(_SLICE_S):
                for r in job.take_rounds():
                    bar.round(r)
                    if on_round is not None:
                        on_round(r)
        except BaseException:
            # KeyboardInterrupt (or an error in on_round): stop the run cleanly, history intact.
            job.stop()
            while not job.wait(_SLICE_S):
                pass
            raise
        for r in job.take_rounds():
            bar.round(r)
            if on_round is not None:
                on_round(r)
    finally:
        bar.close()
    job.check()
