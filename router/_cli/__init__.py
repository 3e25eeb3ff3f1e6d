"""The `d3router` command.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
