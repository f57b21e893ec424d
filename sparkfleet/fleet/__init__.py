"""Fleet I/O: transports (SSH, local), the node-side helpers they ship, and the facts they return."""
