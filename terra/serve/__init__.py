"""``terra-serve``: closed-loop sessions (terra/session/) over HTTP and WebSocket, and a page to drive them.

:mod:`terra.serve.settings` (limits, token), :mod:`terra.serve.service` (sessions and their limits),
:mod:`terra.serve.sockets` (the WebSocket protocol), :mod:`terra.serve.media` (frames, uploads, videos),
:mod:`terra.serve.app` (routes), :mod:`terra.apps.serve` (the Hydra app); the page is ``static/``.
"""
