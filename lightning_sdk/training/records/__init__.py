"""What a run leaves behind: its folder (`run.json`, rank info), the episode files, the metrics writers and
progress output, and the HTML report."""

__all__: list[str] = []
