"""Tables the commands print alike: one printer for predicted-beside-measured configurations."""

from __future__ import annotations

from tilecast.cli.common import quiet_check_line
from tilecast.loop.candidates import short_label


def print_executed(execution) -> None:
    """The configurations run on StarPU beside their predictions (``tune --execute``, ``demo``): predicted and
    measured step, its error (and the recalibrated prediction's, if any), makespans, spread."""
    recal = any(c.after is not None for c in execution.checked)
    width = max([30] + [len(short_label(c.prediction.config.tiling)) for c in execution.checked])
    print(f"{'#':>3} {'tiling':<{width}} {'sched':<7}{'wk':>3}{'pred step':>11}{'real step':>11}{'error':>8}"
          + (f"{'recal step':>11}{'error':>8}" if recal else "") + f"{'pred mksp':>11}{'real mksp':>11}{'spread':>8}")
    for c in execution.checked:
        cfg = c.prediction.config
        line = (f"{c.rank:>3} {short_label(cfg.tiling):<{width}} {cfg.sched:<7}{cfg.workers:>3}"
                f"{c.prediction.step_s * 1e3:>11.2f}{c.measurement.median_s * 1e3:>11.2f}{100 * c.error:>7.1f}%")
        if recal:
            line += f"{c.after.step_s * 1e3:>11.2f}{100 * c.error_after:>7.1f}%"
        pred = c.after if recal else c.prediction
        print(line + f"{pred.makespan_s * 1e3:>11.2f}{c.measurement.makespan_s * 1e3:>11.2f}"
                     f"{100 * c.measurement.spread:>7.0f}%")
    print("times in ms; step time = makespan (mksp: the tasks) + host cost (the rest of the step); "
          "error = (predicted - measured) / measured; measured = median of the timed steps after warm-up; "
          "spread = (max - min) / median of the timed steps")
    if execution.busy_note():
        print(execution.busy_note())
    if execution.quiet:
        print(quiet_check_line(execution.quiet, execution.rows()))
