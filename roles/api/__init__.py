"""The HTTP API role: app and lifespan, auth, request bodies, routes per resource."""
