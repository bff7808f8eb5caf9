"""Other wire formats in the episode's chat terms, pure Python: Responses items, Messages content blocks, and
OpenTelemetry GenAI spans (the importer of traces written elsewhere). Nothing here imports the capture."""
