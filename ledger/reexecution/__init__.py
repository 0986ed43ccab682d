"""Re-execution (docs/design.md §5, fifth of the replay family): requests, approvals, the durable
queue and its worker, the external executor's claim.

- services.py: request (one run, or an `evaluate` batch), approve, deny, expire, claim, renew,
  start/finish, and the settlement of a request by its new run's terminal event; each writes its
  audit entry in its own transaction and announces on commit
- selectors.py: reads (a request, a run's requests, pending approvals, counts) and the API shape
- tasks.py: the django-tasks task the built-in worker runs
- worker.py: executing a request through the runtime, the lease heartbeat, stalled-request
  recovery, `ledger worker`

Who executes: a request whose run was started by a workflow registered in this deployment goes to
the django-tasks queue (`executor: builtin`); any other waits for an external harness to claim it
(`POST /api/v1/reexecutions/claim`, `executor: external`) — never both. An external harness
appends the new run through the normal append path; the request follows that run's terminal
event (succeeded on RunCompleted, failed on RunFailed) in the append's own transaction.
"""
