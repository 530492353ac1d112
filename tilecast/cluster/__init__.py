"""Distributed what-if: cluster descriptions, collectives, parallel strategies, step timelines.

One concept per module:

- ``hardware``: cluster descriptions (YAML under ``clusters/``), validated on load.
- ``collectives``: alpha-beta costs of collectives placed on the right fabric.
- ``models``: transformer shapes (GPT-2 presets plus larger GPT-3-style shapes).
- ``strategy``: a parallel layout (TP/PP/DP, ZeRO, schedule, recomputation, ...).
- ``flops``: per-layer flops (causal attention), the model-flops (MFU) and hardware-flops (HFU) formulas.
- ``pipeline_split``: layers per pipeline stage (even, LM-head aware, explicit).
- ``memory``: memory per GPU.
- ``costs``: durations of the layer-level tasks of one rank.
- ``schedule``: pipeline schedules (GPipe, 1F1B, interleaved 1F1B).
- ``timeline``: the layer-level task graph of one pipeline, simulated by the stream engine.
- ``evaluate``: one configuration -> step time, breakdown, throughput, memory.
- ``search`` / ``sweep``: many configurations.
- ``validation``: predictions against published measurements; ``calibrate``: the fitted figures;
  ``lopo``: leave-one-publication-out errors from the stored folds.
- ``inference_memory`` / ``inference_costs`` / ``inference``: serving (prefill, decode, KV cache,
  continuous batching), ``inference_sweep``; ``inference_validation`` / ``inference_calibrate``: against published serving figures;
  ``inference_report``: the generated tables of ``validation/README.md``.
"""
