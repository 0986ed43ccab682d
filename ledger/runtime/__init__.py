"""The runtime (docs/design.md §6): workflows defined in Python, executed and recorded through the
one write path, with two levels of durability (committed steps never run again; inside an
unfinished `ai.generate` step, committed model and tool calls fast-forward from the log).

- registry.py: named, versioned workflow definitions and their step kinds (code.run, tool.call,
  ai.generate, decision loops, parallel groups, sub-workflows; retries on each), with an example
- providers.py: model providers (`scripted`; `openai_compat.py`: `openai-compatible`)
- record.py: what the log already holds (the fold's state), indexed for fast-forwarding
- recorder.py: the one recorder: owns the run lease and fencing token, reads the log through the
  fold, batches the writes
- testing.py: test seams (kill switches) that tests install; inert in production
- toolcalls.py: one tool call through the tool gateway
- session.py: the `ai.generate` agent loop (a harness session)
- executor.py: `start_run` / `resume_run`, steps, loops, parallel groups and sub-runs
"""
