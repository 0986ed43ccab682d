"""The replay family (DESIGN.md §5): evidence, catch-up, the tool gateway, replay plans, divergence."""
