"""The attention contract: its schema, the semantics rules, each engine's snapshot and its mapping."""
