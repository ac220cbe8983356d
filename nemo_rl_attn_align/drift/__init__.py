"""Measured drift: the sweep's shape from the recipe, and the sweep over the reference and engine replays."""
