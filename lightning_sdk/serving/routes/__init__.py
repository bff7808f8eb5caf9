"""Routes the app mounts beside the served APIs: the OpenAPI description of the server and rewards that
arrive after their episode."""
