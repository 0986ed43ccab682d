"""The replay family (docs/design.md §5): evidence, catch-up, the tool gateway, replay plans, divergence."""
