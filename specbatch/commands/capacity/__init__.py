"""``specbatch capacity``: the highest request rate one replica sustains within SLOs, per policy.

``inputs`` parses SLOs and policy specs and builds the base run config; ``search``
brackets and bisects the rate with several seeds per point on a process pool;
``costing`` turns a rate into replicas and a price; ``report`` writes the HTML and
Markdown report; ``cli`` wires them to the command line. Importing this package is
cheap (the CLI imports it while building its parser).
"""
