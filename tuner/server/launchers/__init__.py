"""Small wrappers that start a real server with settings its own command line lacks.

Each is run as `python -m tuner.server.launchers.<name> ...` from a search space's
`server.command`, reads
its extra settings from environment variables (so a space can sample them as `env` parameters), and
then hands the rest of the command line to the server unchanged.
"""
