"""scaleflu.radio."""
