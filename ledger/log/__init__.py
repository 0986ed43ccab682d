"""The event log: the one door every event comes in by, and what the append keeps beside it."""
