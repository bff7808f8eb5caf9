"""Tool calls, for every API: the Hermes call format and its parsers, the grammars that constrain strict and
forced calls, and what a strict tool's schema must say."""
