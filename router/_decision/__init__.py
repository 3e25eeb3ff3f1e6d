"""The decision: a request's decision state, the engine call under its deadline, the policy's verdict, the
decision record and its log, shadow policies. Knows nothing of HTTP or of any one client API.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
