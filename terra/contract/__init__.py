"""The model's contract: what the world model, the data, the simulator and the apps agree on.

:mod:`terra.contract.actions` (each frame's ``[6, 3]`` action, the rates), :mod:`terra.contract.routes` (each frame's
``[K, 3]`` route, the one-frame shift of route slots, the one route check) and :mod:`terra.contract.layout` (the
token layout of a window and the plan of windows). A floor under ``config``, ``models`` and ``generation``: it
imports only :mod:`terra.core` and numpy, so every wing above takes these facts from here instead of writing them
again.
"""
