"""Offline evaluation: replaying recorded traffic through policies, calibrating thresholds, the Markdown and
HTML reports, and their commands.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
