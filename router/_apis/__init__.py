"""One adapter per client API (chat, completions, Responses, Anthropic Messages) and their registry: what is
API-specific about a decided request (its body's shape, the model and parameter rewrite, the upstream path, the key
header, the error body), and reading a decided request's body.

The names this room offers to the others are imported from its modules; the public ones are re-exported by
`router/__init__.py`."""
