"""The simulated lab: a stand-in of an inventory's nodes on this machine, labelled as a simulation everywhere.

`lab` builds and tears it down and injects faults; `node` runs each node as a machine of its own
(bubblewrap root, processes, hostname), `netlab` wires their networks (root, ssh mode); `shim` is the
stdlib-only stand-in for nvidia-smi, docker and ibdev2netdev on each node's PATH; `paths` says where
everything lives (docs/sim-layout.md is the contract); `values` holds every simulation input in one place.
"""
