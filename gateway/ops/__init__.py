"""Running it: the server, logs, metrics, doctor, backups, the start-up summary, child
processes and secret files."""
