"""scaleflu.fl."""
