"""Webhooks: signed deliveries of job events to URLs named by requests (docs/webhooks.md)."""
