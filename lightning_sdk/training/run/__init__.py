"""One training run's machinery: starting its parts (engine, endpoint, runner protocol), the session that
holds them and switches phases, the event loop and environment of its rollouts, the upstream the
endpoint passes other requests to, and the warnings a run gives once."""
