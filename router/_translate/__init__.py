"""Translating between client APIs (chat, completions, responses, messages): a route to an upstream that speaks
another API than the client's carries the request over and the answers (whole, streamed event by event, errors)
back, naming what could not be carried (docs/translation.md).

    tr = translation("messages", "chat")   # router/_translate/registry.py; the protocols in base.py
"""
