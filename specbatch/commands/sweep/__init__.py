"""``specbatch sweep``: run a grid of scenarios (policy x rate x seed x ...) into one tidy table.

``spec`` reads the sweep file and resolves every cell's config up front; ``store`` keeps
one file per finished cell so a killed sweep resumes; ``executors`` run cells in this
process, a process pool or on Dask; ``runner`` ties them together; ``cli`` is the command.
"""
