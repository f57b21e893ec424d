"""Node-side helpers: stdlib-only Python files copied to ~/.cache/sparkfleet/bin/ and run with python3."""
