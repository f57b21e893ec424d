"""Engine adapters: each engine's launch (ContainerSpec), rules, log vocabulary and metric names.

`engine_for(name)` (engines/registry.py) gives a profile's adapter; the registry lists them.
"""
