"""What serving over HTTP needs whatever the app: a server in a background thread, and a request that stops
when its client goes away."""
