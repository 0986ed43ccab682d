"""Regression evaluations on recorded runs (docs/evaluations.md): datasets of runs, scorers,
evaluation policies with their budgets, and evaluations of a change against a dataset.

It sits above ledger/reexecution in the layers: an evaluation is an `evaluate` batch of
re-execution requests plus its scorers; it hangs on the requests' changes (to score and report)
and on their live model calls (to keep the spend inside a ceiling) through the hooks registered
in apps.py.
"""
