"""The controller's HTTP edge: the JSON gateway (`app.HttpGateway`), event streams, OpenAI
routes and /metrics.

Nothing is imported here: a route module imported on its own does not pull in the gateway that
registers it (`app` imports the route modules, never the reverse).
"""
