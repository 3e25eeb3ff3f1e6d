"""What operators see: Prometheus metrics, OpenTelemetry traces, the access and request logs.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
