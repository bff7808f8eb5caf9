"""The rewards an episode gets: from the agent's own code (`@reward`, `emit_reward`), after it finished
(`feedback`), and from a model that compares a group of attempts (`Judge`)."""
