"""Worked examples of the course that use a strategy the way a student's
program would (kept out of the strategy files themselves)."""
