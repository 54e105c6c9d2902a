"""Small helpers shared by layers, models and experiments."""
