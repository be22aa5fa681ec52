"""The callbacks and the run summary they feed."""
