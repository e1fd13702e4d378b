"""The in-process engine: jobs, queue and events in this controller's memory (the default)."""
