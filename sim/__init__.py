"""specbatch simulator: cost model, acceptance model, scheduler, SimPy engine, metrics.

Importing ``sim`` stays cheap and torch-free so that ``python -m calibrate`` can use
``sim.costmodel.profile`` (the profile format ``sim`` owns) on a GPU box with only torch,
numpy and pandas installed. Heavier modules (SimPy engine, CLI) are imported lazily.
"""

__version__ = "0.1.0"
