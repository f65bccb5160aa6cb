"""Training-step construction shared by every experiment that runs the Transformer (`step`)."""
