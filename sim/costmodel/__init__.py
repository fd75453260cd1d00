"""The cost model: what a step costs on a GPU.

* ``profile``: the profile format (cost curves in CSV with a JSON sidecar), measured by
  ``calibrate/`` or composed from kernel tables by :mod:`sim.compose`;
* ``curves``: the curves fitted to a profile's points;
* ``model``: the cost model over them (a step's price by batch size, k, context and draft lag)
  and the step table it is pre-tabulated into for a run;
* ``rules``: the look-ups of that table a step makes, compiled or not (sim/jit.py);
* ``cache``: fitted curves and step tables kept on disk between runs.
"""
