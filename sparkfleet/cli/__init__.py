"""The `sparkfleet` command line: one module per subcommand, registered in main.py.

A command's handler imports what it runs inside the function, not at the module's top: building the
parser (`sparkfleet --help`, shell completion, a typo's usage line) loads every command's module, and
must not pay for the transports, the runner or the exporter that only one command uses (start-up time;
main.py says how commands are found).
"""
