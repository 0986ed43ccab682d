"""Console pages, one module per page family; each exports its own `urlpatterns`.

- runs.py: the home redirect, the runs list and the workspace switcher
- run.py: the run page and its tabs (htmx partials that also work as plain links)
- usage.py: the usage report
"""
