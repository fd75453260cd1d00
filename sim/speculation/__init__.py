"""Speculation: how many draft tokens a step proposes and keeps, and with what method.

* ``methods``: the method (vLLM's ``speculative_config``, SGLang's flags) and its plan for a run
  (drafter, tree, lag, KV capacity, default acceptance);
* ``acceptance``: how many of a row's k drafts are kept (geometric, per-position, traces, run
  lengths), drawn per step;
* ``proposals``: how many each row proposes (a host matcher only where it matches), as rules the
  step calls compiled or not;
* ``trees``: a tree draft's shape and its longest accepted path.
"""
