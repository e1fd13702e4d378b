"""Realtime sessions on the worker: the streaming-model interface and the session relay."""
