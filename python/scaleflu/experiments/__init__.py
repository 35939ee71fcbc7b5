"""scaleflu.experiments."""
