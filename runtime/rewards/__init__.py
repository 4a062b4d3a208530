"""Reward functions (pure, by name), the guard that calls them, and the reward-model scorer."""
