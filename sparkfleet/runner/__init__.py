"""The runner: executes a playbook's steps against the fleet, one run at a time, and records it."""
