"""d3-router's HTTP side: the reverse proxy, the Starlette middleware and the `d3router` command."""

__all__: list[str] = []
