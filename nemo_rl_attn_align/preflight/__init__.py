"""Before any GPU work: the recipe's facts, the rules that stop configs that cannot work, the backend plan, the
preset."""
