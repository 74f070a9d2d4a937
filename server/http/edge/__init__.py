"""What every request passes before a route: errors, body reading, ASGI guards, cost limits, JSON."""
