"""What every request passes through before a route: the error shape, body reading, the ASGI guards
(origin, auth, body limit), the caps on what one request may cost, and JSON rendering."""
