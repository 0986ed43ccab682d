"""Channels consumers of the console (docs/design.md §7), one module per live view; each exports
`websocket_urlpatterns`, collected by console/routing.py.

- run.py: `/ws/runs/<runId>/?after=N`, the run page's timeline
- runs.py: `/ws/workspaces/<tenant>/<workspace>/runs/`, new runs at the top of the runs list
"""
