"""The model's attention: its ``config.json``, the architecture table and rules, each host's layer layout, the facts."""
