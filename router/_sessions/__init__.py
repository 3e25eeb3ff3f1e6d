"""Conversations: a session's key, its sticky route and escalation, and the stores that keep them (in process,
or Redis shared between replicas).

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
