"""Run predicted configurations on StarPU and put the measurement beside the prediction.

Optionally (``recalibrate``) each measured trace updates the kernel models
(:func:`tilecast.perfmodel.from_trace.calibration_from_trace`), and the step
times and traces the host-cost fit and the runtime's cost per task
(:func:`tilecast.loop.host_cost.learn_from_runs`):
the steps are predicted again with the updated models and both errors are reported.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

from tilecast.loop.measure import Measurement, measure_round, measurement_of, split_steps
from tilecast.loop.predict import predict, relative_error


@dataclass
class Checked:
    """One configuration, predicted and measured."""

    prediction: object
    measurement: object
    rank: int  # 1-based position in the predicted ranking
    after: object = None  # the prediction with recalibrated kernel models
    sessions: list | None = None  # per session, the reference probes around it (QuietGuard.verdict), if guarded

    @property
    def error(self) -> float:
        return relative_error(self.prediction.step_s, self.measurement.median_s)

    @property
    def error_after(self) -> float | None:
        return None if self.after is None else relative_error(self.after.step_s, self.measurement.median_s)

    def row(self) -> dict:
        out = {"rank": self.rank, **self.prediction.row(), "real_step_s": self.measurement.median_s,
               "real_steps_s": self.measurement.step_s, "warmup_steps": self.measurement.warmup,
               "real_rounds_s": self.measurement.rounds, "real_round_medians_s": self.measurement.round_medians_s,
               "real_makespan_s": self.measurement.makespan_s, "real_host_s": self.measurement.host_s,
               "real_spread": self.measurement.spread, "error": self.error}
        if self.sessions is not None:
            out["sessions_disturbed"] = sum(s["disturbed"] for s in self.sessions)
            out["sessions_retaken"] = sum(s["retakes"] for s in self.sessions)
            out["reference_ratio_max"] = max(max(s["probe_before"], s["probe_after"]) for s in self.sessions)
            # per session, in the order measured: its median step and the reference probes around it, as
            # ratios to the run's fastest probe (what tells a slow spell of the machine from the configuration)
            out["sessions"] = [{"median_s": m, "probe_before": s["probe_before"], "probe_after": s["probe_after"],
                                "disturbed": bool(s["disturbed"]), "retakes": s["retakes"]}
                               for m, s in zip(self.measurement.round_medians_s, self.sessions)]
        if self.after is not None:
            out["pred_step_s_recalibrated"] = self.after.step_s
            out["error_recalibrated"] = self.error_after
        return out

    def comparison(self):
        """:func:`tilecast.reports.compare` of the predicted and the measured last step (with ``before``),
        headed by the step times: predicted, and the median measured with its median makespan."""
        from tilecast.reports import compare

        pred = self.after if self.after is not None else self.prediction
        before = self.prediction.result.trace() if self.after is not None else None
        m = self.measurement
        return compare(pred.result.trace(), m.trace, graph=m.graph, before=before, pred_step=pred.step_s,
                       real_step=(m.median_s, m.makespan_s),
                       before_step=self.prediction.step_s if before is not None else None)


@dataclass
class Execution:
    checked: list = field(default_factory=list)
    calibration: object = None  # the recalibrated kernel models, when asked for
    host_costs: dict | None = None  # the host-cost fits refined with the measured steps, when asked for
    load_average: tuple = ()  # 1-minute load average before and after the runs
    quiet: dict | None = None  # QuietGuard.summary() when sessions were guarded
    learned: list | None = None  # per configuration, the measurement the models learned from (recalibrate)

    def busy_note(self) -> str | None:
        """A warning when other processes shared the cores while measuring, else None."""
        cores = os.cpu_count() or 1
        # the load before the runs: during them it also counts StarPU's own (spinning) workers
        if self.load_average and self.load_average[0] > 0.75 * cores:
            return (f"note: other processes were running (load average {self.load_average[0]:.1f} on {cores} "
                    "cores before the runs): measured times include their interference")
        return None

    def rows(self) -> list:
        return [c.row() for c in self.checked]

    def save_models(self, machine) -> list:
        """Store the recalibrated kernel models and host-cost fits for the next predictions; their paths."""
        from tilecast.loop.host_cost import save_host_costs

        paths = [self.calibration.save()]
        if self.host_costs:
            paths.append(save_host_costs(machine, self.host_costs))
        return paths


MIN_TIMED_S = 1.5  # short steps are timed more often: at least this many predicted seconds of timed steps
MAX_STEPS = 40
SHORT_STEP_S = 0.25  # steps predicted shorter than this are measured over several StarPU sessions
# Sessions of a short configuration: on the 2-core machine one session in five of the tiny model's tile-128
# step (196 tasks, 46-54 ms a step) could run 15-20% slow throughout, with quiet reference steps around it.
SHORT_ROUNDS = 8


def steps_for(predicted_s: float, steps: int, min_timed_s: float = MIN_TIMED_S) -> int:
    """Timed steps for a configuration: ``steps``, more for short steps (their times jitter more), at most
    :data:`MAX_STEPS`."""
    want = int(np.ceil(min_timed_s / max(predicted_s, 1e-6)))
    return max(steps, min(MAX_STEPS, want))


def rounds_for(predicted_s: float, steps: int, long_rounds: int = 1) -> int:
    """StarPU sessions to measure a configuration in: several for short steps, whose time varies by session
    (at least 3 timed steps each, every session paying its own warm-up); ``long_rounds`` for the others, with at
    least 2 timed steps each."""
    if predicted_s < SHORT_STEP_S:
        return max(1, min(SHORT_ROUNDS, steps // 3))
    return max(1, min(long_rounds, steps // 2))


def session_order(plans: list) -> list:
    """(configuration, session) pairs to run, spread over the whole measurement.

    ``plans`` holds, per configuration, its timed steps per session. The
    sessions run in blocks: block ``b`` holds session ``b`` of every
    configuration measured in several, then its share of the single-session
    (long) configurations, in order. A slow spell of the machine then shifts
    one session of many configurations instead of all sessions of a few.
    """
    short = [i for i, p in enumerate(plans) if len(p) > 1]
    long = [i for i, p in enumerate(plans) if len(p) == 1]
    blocks = max((len(plans[i]) for i in short), default=1)
    order = []
    for b in range(blocks):
        order += [(i, b) for i in short if b < len(plans[i])]
        order += [(i, 0) for i in long[b * len(long) // blocks:(b + 1) * len(long) // blocks]]
    return order


def execute(predictions, ranking, machine, calibration, host_costs, steps: int = 5, warmup: int = 2,
            recalibrate: bool = False, progress: bool = True, min_timed_s: float = MIN_TIMED_S,
            guard=None, long_rounds: int = 1, groups: list | None = None) -> Execution:
    """Measure every prediction of ``predictions`` (members of ``ranking``) on StarPU.

    Each runs ``warmup`` steps then :func:`steps_for` timed steps (``min_timed_s=0``:
    exactly ``steps``), short ones over :func:`rounds_for` StarPU sessions, the others over ``long_rounds``.
    The sessions of different configurations are interleaved
    (:func:`session_order`), so that a slow spell of the machine spreads over
    several configurations instead of shifting one of them.

    With a ``guard`` (:class:`tilecast.loop.interference.QuietGuard`) every
    session runs between two reference probes and is retaken when they show
    the machine disturbed; each row then says how its sessions fared.

    With ``groups`` (a key per prediction: the configurations a choice is
    made between), those measured within a few percent of their group's
    fastest are measured again, in turns (:mod:`tilecast.loop.contenders`).

    Each is simulated again with its trace kept (for the comparison). With
    ``recalibrate`` the kernel models learn from every measured trace
    (of the sessions the guard found quiet, :func:`quiet_rounds`; those of
    one task graph together, :func:`learning_groups`) and every
    configuration is predicted once more with the final models.
    """
    out = Execution(calibration=calibration)
    load_before = os.getloadavg()[0]
    position = {id(p): i + 1 for i, p in enumerate(ranking)}
    plans = []
    for p in predictions:
        n = steps_for(p.step_s, steps, min_timed_s) if min_timed_s > 0 else steps
        plans.append(split_steps(n, rounds_for(p.step_s, n, long_rounds)))
    done, probes = _measure_sessions(predictions, plans, warmup, guard, progress, groups)
    learned = []  # per configuration, the measurement the models learn from: its quiet sessions
    for i, p in enumerate(predictions):
        cfg = p.config
        m = measurement_of(done[i], warmup)
        full = predict(cfg, machine, calibration, host_costs, graph=m.graph, keep_result=True)
        sessions = [guard.verdict(info) for info in probes[i]] if guard is not None else None
        out.checked.append(Checked(full, m, position.get(id(p), 0), sessions=sessions))
        if recalibrate:
            learned.append(measurement_of(quiet_rounds(done[i], sessions), warmup))
    out.load_average = (load_before, os.getloadavg()[0])
    out.quiet = guard.summary() if guard is not None else None
    if recalibrate:
        out.learned = learned
        out.calibration, out.host_costs = learn_from_measurements(
            [p.config for p in predictions], learned, machine, calibration, host_costs)
        for c in out.checked:
            c.after = predict(c.prediction.config, machine, out.calibration, out.host_costs, graph=c.measurement.graph,
                              keep_result=True)
    return out


def learn_from_measurements(configs, measurements, machine, calibration, host_costs, excess: bool = True) -> tuple:
    """(kernel calibration, host-cost fits) refined from measured runs of ``configs``.

    The kernel models learn every measurement's traces (those of one task
    graph and worker count together, :func:`learning_groups`); the host-cost fits and the
    runtime's cost per task learn the step times and traces
    (:func:`tilecast.loop.host_cost.learn_from_runs`), and the constant cost between tasks
    what the traces wait beyond it (:func:`learn_delay_excess`; ``excess`` False: not, as before).
    """
    from tilecast.loop.host_cost import learn_from_runs
    from tilecast.loop.runtime_overhead import task_overhead
    from tilecast.perfmodel.from_trace import calibration_from_trace

    cal = calibration
    for graph, traces, workers in learning_groups(configs, measurements):
        cal = calibration_from_trace(graph, traces, machine, base=cal, workers=workers)
    runs = []
    for cfg, m in zip(configs, measurements):
        overhead = float(np.median([task_overhead(m.graph, t) for t in m.traces]))
        runs.append((cfg.workers, cfg.sched, m.graph.n_tiles, m.graph.n_tasks, m.makespan_s,
                     m.makespan_s + m.host_s, overhead))
    fits = learn_from_runs(host_costs or {}, runs)
    return cal, learn_delay_excess(configs, measurements, machine, cal, fits) if excess else fits


def learn_delay_excess(configs, measurements, machine, calibration, fits: dict) -> dict:
    """``fits`` with what each configuration's measured runs wait between tasks beyond their simulation with
    ``calibration`` and ``fits`` (:func:`tilecast.loop.runtime_overhead.delay_excess`) added to the constant
    cost between tasks of its (worker count, scheduler), for its task graph alone
    (``HostCost.graph_excess``; the total not below 0): the mean over the graph's runs weighted by their tasks per
    second of step, as the cost per task matters.

    Durations learned from a run's traces are its tasks' means, every interruption counted; the cost between
    tasks is the probes' model, fitted on the typical delay of other graphs. Without this the simulation of
    a run from its own traces left out what its workers spent between tasks beyond that model, and learning
    from a configuration's own runs predicted it faster than measured (accuracy run 12: repeatability bias
    -11.9%, docs/accuracy.md). It is a residual of the graph's own learned durations: charged to every graph of
    the scheduler, as until 2026-12-03, it made the graphs of model shapes that never ran (still on the
    calibration's durations) 4% slower at the median (run 27's held-out view: +7.8% bias against +3.8%)."""
    from dataclasses import replace

    from tilecast.loop.host_cost import fit_key
    from tilecast.loop.predict import predict
    from tilecast.loop.runtime_overhead import delay_excess

    found: dict = {}
    for cfg, m in zip(configs, measurements):
        key = fit_key(cfg.workers, cfg.sched)
        if key not in fits or fits[key].task_overhead_s is None or not m.traces:
            continue
        p = predict(cfg, machine, calibration, fits, graph=m.graph, keep_result=True)
        rate = m.graph.n_tasks / max(m.median_s, 1e-9)
        found.setdefault((key, cfg.graph_id), []).append((rate, delay_excess(m.graph, m.traces, p.result.trace())))
    out = dict(fits)
    for (key, graph_id), rows in found.items():
        w = np.array([r[0] for r in rows])
        excess = float(np.average([r[1] for r in rows], weights=w))
        fit = out[key]
        total = fit.graph_excess.get(graph_id, 0.0) + excess
        out[key] = replace(fit, graph_excess={**fit.graph_excess, graph_id: max(total, -fit.task_overhead_s)})
    return out


def learning_groups(configs, learned: list) -> list:
    """``(graph, traces, workers)`` per task graph and worker count: the traces of every measured configuration
    that runs it on that many workers (the same tiling under several schedulers), learned from together.

    A shape's figure is then its mean over the central ones of all those steps
    (:func:`tilecast.perfmodel.from_trace.central_steps`). Learning from
    each configuration in turn let the last one measured replace the shapes
    of the others: on the 2-core machine a single 20 s session of a 2.7 s
    step can run 3-7% slow with references that looked quiet, and the
    configuration that happened to be measured last decided the shapes of
    both. Steps on different worker counts are learned apart: a task runs
    longer on two busy cores than on one (shared memory bandwidth, tiles last
    touched on the other core; the in-step sums of three steps measured 2-9%
    higher on two workers), and one median over both gave the one-worker steps
    some of the two-worker durations and the reverse.
    """
    groups: dict = {}
    for cfg, m in zip(configs, learned):
        traces = groups.setdefault((cfg.graph_key, cfg.workers), (m.graph, [], cfg.workers))[1]
        traces.extend(m.traces)
    return list(groups.values())


def quiet_rounds(rounds: list, sessions: list | None) -> list:
    """The rounds (sessions) of a configuration that the quiet check found undisturbed; all of them when
    unchecked or when none was quiet. Recalibration learns from these only: a session in one of the
    machine's slow spells would teach the models its slowness."""
    if not sessions:
        return rounds
    return [r for r, s in zip(rounds, sessions) if not s["disturbed"]] or rounds


def _measure_sessions(predictions, plans, warmup: int, guard, progress: bool, groups: list | None = None):
    """Every session of every configuration, in :func:`session_order`; per configuration, its sessions'
    :func:`measure_round` results and (with a ``guard``) their reference probes.

    With ``groups``, the contenders of each group (:func:`tilecast.loop.contenders.contenders`) then get as many
    sessions again as they had, in turns; ``plans`` grows by them.

    With a guard, each session's wait for quiet gets a share of the waiting
    budget (:meth:`~tilecast.loop.interference.QuietGuard.share_budget`), and a
    last pass retakes the sessions that the run's fastest reference shows
    disturbed though they looked quiet when measured (the run began in a slow
    spell), while the guard has waiting budget left.
    """
    order = session_order(plans)
    done = [[None] * len(p) for p in plans]
    probes = [[None] * len(p) for p in plans]

    def run(i, k, what):
        cfg = predictions[i].config
        if progress:
            of = f", session {k + 1} of {len(plans[i])}" if len(plans[i]) > 1 else ""
            print(f"executing {what}: {cfg.label()} ({warmup} warm-up + {plans[i][k]} steps{of})", file=sys.stderr)
        if guard is None:
            done[i][k] = measure_round(cfg, plans[i][k], warmup)
            return
        result, info = guard.measure(lambda c=cfg, n=plans[i][k]: measure_round(c, n, warmup))
        if probes[i][k] is not None:  # a retake of the last pass
            info["retakes"] += probes[i][k]["retakes"] + 1
        if progress and info["retakes"]:
            print(f"  retaken {info['retakes']}x: the reference step ran slow around it", file=sys.stderr)
        done[i][k], probes[i][k] = result, info

    for j, (i, k) in enumerate(order):
        if guard is not None:
            guard.share_budget(len(order) - j)
        run(i, k, f"{j + 1}/{len(order)}")
    if groups is not None:
        again = _second_look(predictions, plans, done, probes, warmup, groups, progress)
        for j, (i, k) in enumerate(again):
            if guard is not None:
                guard.share_budget(len(again) - j)
            run(i, k, f"again side by side {j + 1}/{len(again)}")
        order += again
    if guard is not None:
        late = [(i, k) for i, k in order
                if guard.verdict(probes[i][k])["disturbed"] and probes[i][k]["retakes"] < guard.max_retakes]
        for j, (i, k) in enumerate(late):
            if guard.budget_left_s <= 0:
                break
            guard.share_budget(len(late) - j)
            guard.retaken += 1
            run(i, k, f"again {j + 1}/{len(late)}")
    return done, probes


def _second_look(predictions, plans, done, probes, warmup: int, groups: list, progress: bool) -> list:
    """The sessions to add for the contenders of each group (their plans, results and probes extended with
    room for them), in :func:`tilecast.loop.contenders.contender_order`."""
    from tilecast.loop.contenders import contender_order, contenders

    medians = [Measurement([r[0] for r in d], warmup, None, None, None).median_s for d in done]
    picked = contenders(medians, groups)
    extra = {}
    for g in picked:
        for i in g:
            extra[i] = (len(plans[i]), len(plans[i]))
            plans[i] += list(plans[i])
            done[i] += [None] * extra[i][1]
            probes[i] += [None] * extra[i][1]
    if progress and picked:
        names = "; ".join(", ".join(predictions[i].config.label() for i in g) for g in picked)
        print(f"measuring again side by side, as within a few percent of the fastest: {names}", file=sys.stderr)
    return contender_order(picked, extra)
