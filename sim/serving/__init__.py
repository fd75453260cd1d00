"""The engine: one step, written once (sim/serving/step.py), and what drives it.

* :mod:`sim.serving.step`: the step: ``begin`` (the scheduler's first look, the view a policy
  sees), ``plan`` (the scheduler's decision), ``price`` and ``draw`` (the simulator's backend),
  ``update`` (apply and record), over the replica's state grouped by owner (``Replica``).
* :mod:`sim.serving.plan`: :class:`~sim.serving.plan.Plan`, the decision as a backend reads it.
* :mod:`sim.serving.loop`: :class:`ServingLoop`, the step driven from Python around a Python
  policy and any backend (:class:`~sim.serving.loop.StepBackend`: ``run(plan)``).
* :mod:`sim.serving.kernel` and :mod:`sim.serving.compiled`: the same step in a compiled loop,
  many steps per call, with the policy's compiled form.
* :mod:`sim.serving.rules`: applying a step's outcome (tokens, joins, retirements, records).
* :mod:`sim.serving.state`: the arrays; :mod:`sim.serving.records`: the step record and buffers.
* :mod:`sim.serving.priced`: the simulator's backend (the step table and the acceptance
  sampler); the real replay's is :mod:`calibrate.replay`, a playback's :mod:`sim.serving.recorded`.
* :mod:`sim.serving.queues`: where a replica's requests come from: an arrival array (one
  replica), a router pushing them (a cluster), or the hand-offs of disaggregated serving.
* :mod:`sim.serving.transfer`: the link a disaggregated run's KV blocks cross.
* :mod:`sim.serving.clock`: what keeps the time: a SimPy process (simulated time, one event per
  step; the only module that touches SimPy) or the wall clock (the replay).
"""
