"""Reusable Bytewax operators of kascade and their pure cores.

Each module is one concept. Modules here import ``schemas`` only: never torch, never
``dataflow``.
"""
