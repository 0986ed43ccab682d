"""Tenants, workspaces, members, keys; who may see what; share links; retention; workspace rules."""
