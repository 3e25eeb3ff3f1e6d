"""The two HTTP faces: the reverse proxy (its routes, lifecycle and reload, forwarding to upstreams, serving it
with uvicorn) and the Starlette middleware; and the parts both are built from.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
