"""The commands (run, sweep, capacity, regress, validate, replay, timeline, outputs).

They import the simulator core (``sim``) and never the other way round.
"""
