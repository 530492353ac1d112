"""Pipeline schedules: the order in which one pipeline rank runs its forward and
backward passes.

Each entry is ``(phase, micro_batch, chunk)`` with phase ``"F"`` or ``"B"``.

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush; Narayanan et al. 2019/2021): rank s of p runs
  min(p - s - 1, m) warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards.
- Interleaved 1F1B with v model chunks per rank, following Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``: micro-batches go through
  the chunks in groups of p; rank s runs (p - s - 1) * 2 + (v - 1) * p warm-up
  forwards.
"""

from __future__ import annotations


def stage_order(schedule: str, p: int, m: int, v: int, s: int) -> list:
    if schedule == "gpipe":
        return [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
    if schedule == "1f1b":
        warm = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(warm)]
        for i in range(m - warm):
            order.append(("F", warm + i, 0))
            order.append(("B", i, 0))
        order += [("B", j, 0) for j in range(m - warm, m)]
        return order
    if schedule == "interleaved":
        total = m * v

        def mb(k):
            return (k // (p * v)) * p + k % p

        def fchunk(k):
            return (k // p) % v

        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        order = [("F", mb(k), fchunk(k)) for k in range(warm)]
        for k in range(total - warm):
            order.append(("F", mb(warm + k), fchunk(warm + k)))
            order.append(("B", mb(k), v - 1 - fchunk(k)))
        order += [("B", mb(k), v - 1 - fchunk(k)) for k in range(total - warm, total)]
        return order
    raise ValueError(f"unknown schedule {schedule!r}")
