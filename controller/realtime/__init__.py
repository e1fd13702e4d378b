"""Realtime sessions at the controller: admission, placement on a worker, the relay, the edges."""
