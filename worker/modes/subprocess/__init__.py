"""The `subprocess` mode: each job runs a command in its own job folder (and process group)."""
