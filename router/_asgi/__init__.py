"""ASGI plumbing shared by both faces, with no decision in it: header hygiene, reading a body with a cap and
sending an answer, relaying an upstream's response unbuffered.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
