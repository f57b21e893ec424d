"""The simulated lab: a stand-in of an inventory's nodes on this machine, labelled as a simulation everywhere.

`lab` builds and tears it down and injects faults; `shim` is the stdlib-only stand-in for nvidia-smi,
docker and ibdev2netdev copied into each sandbox; `paths` says where everything lives (see
docs/sim-layout.md for the sandbox contract); `values` holds every simulation input in one place.
"""
