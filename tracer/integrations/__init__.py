"""Hooks that put iotrace markers into training frameworks' loops.

Each lives in its own module and imports its framework only there, so the
core never needs one: tracer.integrations.keras (pip install 'iotrace[keras]').
For a plain PyTorch-style loop no hook is needed: tracer.marker.epochs(n).
"""
