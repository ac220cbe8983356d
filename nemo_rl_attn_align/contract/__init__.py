"""The attention contract: its schema, the semantics rules, and the mappers from each engine's facts to a contract."""
