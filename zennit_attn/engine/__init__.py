"""The LRP engine: AttnLRP's rules, the mechanism that applies them at the operations a model performs, the
composites and what it knows of a model's structure. It knows models and tensors, not tokens or texts."""
