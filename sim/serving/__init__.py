"""The one serving loop: schedule -> execute -> apply, whatever runs the step and keeps the time.

* :mod:`sim.serving.loop`: :class:`ServingLoop`, one replica's state (running requests
  are rows of numpy arrays) and its three phases: *schedule* (the scheduler admits a
  block of the queue, or the policy picks k for a decode step), *execute* (a step
  backend prices or runs the step) and *apply* (tokens emitted, rows retired,
  records written).
* :mod:`sim.serving.priced`: the simulator's step backend, the step table and the
  acceptance sampler. The real replay's backend (torch passes, measured time) is
  :mod:`calibrate.replay`; both follow :class:`~sim.serving.loop.StepBackend`.
* :mod:`sim.serving.queues`: where a replica's requests come from: an arrival array
  (one replica) or a router pushing them (a cluster).
* :mod:`sim.serving.clock`: what keeps the time: a SimPy process (simulated time, one
  event per step; the only module that touches SimPy) or the wall clock (the replay).
* :mod:`sim.serving.records`: the named per-step record and the per-request records.
"""
